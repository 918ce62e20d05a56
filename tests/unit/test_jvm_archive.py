"""Which JVM options a Spark driver or the CDC part's JVM gets for its class-data archive."""

import shlex
from pathlib import Path

from tributary.jvm_archive import archive_flags, archive_options


def test_a_missing_archive_adds_nothing(tmp_path: Path) -> None:
    for archive in (tmp_path / "none.jsa", None, tmp_path):  # a folder is no archive
        assert archive_options(archive) == ""
        assert archive_flags(archive) == []


def test_an_archive_is_mapped_quietly_and_its_path_quoted(tmp_path: Path) -> None:
    archive = tmp_path / "with space" / "classes.jsa"
    archive.parent.mkdir()
    archive.write_bytes(b"x")
    flags = archive_flags(archive)
    assert flags[0] == f"-XX:SharedArchiveFile={archive}"  # one item each: no quoting
    assert "-Xlog:cds=off" in flags
    assert shlex.split(archive_options(archive)) == flags  # one string, split back whole
