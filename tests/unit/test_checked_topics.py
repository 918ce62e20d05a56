"""`verify`'s checkpoints: what was read of a topic, kept across runs."""

from pathlib import Path

from cdc.checked import CheckedTopics, Checkpoint


def test_a_checkpoint_is_kept_per_kind_and_topic(tmp_path: Path) -> None:
    checked = CheckedTopics(tmp_path / "verify")
    assert checked.load("table", "cdc.public.users") is None
    checked.save(
        "table", "cdc.public.users", Checkpoint({0: 12, 1: 7}, {"latest": {"k": [3, None]}})
    )
    checked.save("events", "cdc.public.users", Checkpoint({0: 1}, {"seen": {}}))
    loaded = CheckedTopics(tmp_path / "verify").load("table", "cdc.public.users")
    assert loaded == Checkpoint({0: 12, 1: 7}, {"latest": {"k": [3, None]}})
    assert list((tmp_path / "verify").glob("*.tmp")) == []

    checked.drop("table", "cdc.public.users")
    assert checked.load("table", "cdc.public.users") is None
    assert checked.load("events", "cdc.public.users") == Checkpoint({0: 1}, {"seen": {}})


def test_an_unreadable_checkpoint_means_a_whole_read(tmp_path: Path) -> None:
    checked = CheckedTopics(tmp_path)
    (tmp_path / "table-t.json").write_text("{not json")
    assert checked.load("table", "t") is None
    (tmp_path / "table-t.json").write_text('{"format": 0, "ends": {}, "summary": {}}')
    assert checked.load("table", "t") is None  # another format


def test_without_a_folder_nothing_is_kept() -> None:
    checked = CheckedTopics(None)
    checked.save("table", "t", Checkpoint({0: 1}, {}))
    assert checked.load("table", "t") is None
