"""Several views folded in one pass: each member folds only its own topics' records past its
own offsets, and every folded row says whose it is."""

from collections.abc import Iterable, Iterator, Mapping

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from projections.folding import FOLDED_SCHEMA, folded_batch
from projections.together import TOGETHER_SCHEMA, Member, rows_of, together
from projections.view import per_partition
from spark_streaming.kafka_reader import ARROW_SCHEMA
from spark_streaming.view_group import NAME_CHARS, folder_name, lowest_of_readers, only

HERE = "tests.unit.projections.test_together"


def each_record(
    batches: Iterable[pa.RecordBatch], options: Mapping[str, str]
) -> Iterator[pa.RecordBatch]:
    """A fold of one write per record: key = the record's key, position = its offset."""
    for batch in batches:
        n = batch.num_rows
        yield folded_batch(
            {
                "collection": [options["collection"]] * n,
                "key": [k.decode() for k in batch.column("key").to_pylist()],
                "position": batch.column("offset"),
                "deleted": [False] * n,
                "topic": batch.column("topic"),
                "partition": batch.column("partition"),
                "offset": batch.column("offset"),
            },
            n,
        )


def records(topic: str, partition: int, offsets: range) -> pa.RecordBatch:
    rows = [
        {
            "key": f"{topic}-{o}".encode(),
            "value": b"{}",
            "topic": topic,
            "partition": partition,
            "offset": o,
            "timestamp": None,
            "timestampType": 0,
            "headers": [],
        }
        for o in offsets
    ]
    return pa.RecordBatch.from_pylist(rows, schema=ARROW_SCHEMA)


def member(view: str, topics: tuple[str, ...], skip: dict[str, dict[str, int]]) -> Member:
    return Member(view, topics, per_partition(f"{HERE}:each_record", collection=view), skip)


def folded(batch: pa.RecordBatch, *members: Member) -> pa.Table:
    fold = together(members)
    assert fold.ddl.endswith("view string")
    return pa.Table.from_batches(list(fold.function()([batch])), schema=TOGETHER_SCHEMA)


def test_each_member_folds_its_own_topics_and_its_rows_say_whose_they_are() -> None:
    posts = records("posts", 0, range(5, 9))
    table = folded(
        posts,
        member("search", ("posts", "users"), {}),
        member("timeline", ("posts", "follows"), {}),
        member("users-only", ("users",), {}),
    )
    assert table.column("view").to_pylist() == ["search"] * 4 + ["timeline"] * 4
    search = rows_of(table, "search")
    assert search.schema == FOLDED_SCHEMA
    assert search.column("key").to_pylist() == [f"posts-{o}" for o in range(5, 9)]
    assert set(search.column("collection").to_pylist()) == {"search"}
    assert rows_of(table, "users-only").num_rows == 0


def test_a_member_ahead_folds_only_the_records_past_its_own_offsets() -> None:
    posts = records("posts", 1, range(10, 20))
    table = folded(
        posts,
        member("behind", ("posts",), {"posts": {"1": 12}}),
        member("ahead", ("posts",), {"posts": {"1": 17, "0": 99}, "users": {"1": 99}}),
        member("done", ("posts",), {"posts": {"1": 20}}),
    )
    assert rows_of(table, "behind").column("offset").to_pylist() == list(range(12, 20))
    assert rows_of(table, "ahead").column("offset").to_pylist() == [17, 18, 19]
    assert rows_of(table, "done").num_rows == 0


def test_a_shared_query_starts_each_partition_at_the_least_offset_of_its_readers() -> None:
    search = {"posts": {"0": 10, "1": 4}, "users": {"0": 7}}
    timeline = {"posts": {"0": 6, "1": 9}, "follows": {"0": 3}}
    profile: dict[str, dict[str, int]] = {"posts": {"0": 12}, "users": {"0": 2}}
    resume = lowest_of_readers(
        [search, timeline, profile],
        [("posts", "users"), ("posts", "follows"), ("posts", "users", "follows")],
    )
    # posts[1]: profile has not reached it, so it starts at the earliest offset (left out);
    # follows[0]: profile has not reached it either.
    assert resume == {"posts": {"0": 6}, "users": {"0": 2}}
    assert lowest_of_readers([search], [("posts", "users")]) == search
    assert only(timeline, ("follows",)) == {"follows": {"0": 3}}


@pytest.mark.parametrize("topics", [(), ("other",)])
def test_records_of_no_member_topic_fold_to_nothing(topics: tuple[str, ...]) -> None:
    assert folded(records("posts", 0, range(3)), member("a", topics, {})).num_rows == 0


def test_a_shared_querys_checkpoint_folder_name_stays_short_and_unique() -> None:
    names = ["+".join(f"view_{i}_{n}" for i in range(30)) for n in range(2)]
    folders = [folder_name(name) for name in names]
    assert all(len(f) <= NAME_CHARS for f in folders) and folders[0] != folders[1]
    assert folder_name("search+profile") == "search+profile"
