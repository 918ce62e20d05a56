"""Which JVM options a driver gets for its class-data archive."""

from pathlib import Path

from spark_streaming.class_archive import archive_options


def test_a_missing_archive_adds_nothing(tmp_path: Path) -> None:
    assert archive_options(tmp_path / "none.jsa") == ""
    assert archive_options(None) == ""
    assert archive_options(tmp_path) == ""  # a folder is no archive


def test_an_archive_is_mapped_quietly_and_its_path_quoted(tmp_path: Path) -> None:
    archive = tmp_path / "with space" / "classes.jsa"
    archive.parent.mkdir()
    archive.write_bytes(b"x")
    options = archive_options(archive)
    assert f"-XX:SharedArchiveFile='{archive}'" in options
    assert "-Xlog:cds=off" in options
