"""The store model's pure rules: offsets reached, gaps, applied counts, one write per key, the
write table and the position guard over its columns."""

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.stores.writes import NONE, WriteColumns, guard
from tributary.view_model import (
    WRITE_SCHEMA,
    Delete,
    JsonObject,
    Put,
    SourceRef,
    Write,
    applied_count,
    check_unique,
    covers,
    fields_json,
    gaps,
    merge_offsets,
    write_table,
)


def test_offsets_merge_keeps_untouched_partitions_and_never_goes_back() -> None:
    merged = merge_offsets({"t": {"0": 5, "1": 9}}, {"t": {"1": 12, "2": 3}, "u": {"0": 1}})
    assert merged == {"t": {"0": 5, "1": 12, "2": 3}, "u": {"0": 1}}
    assert merge_offsets({"t": {"0": 9}}, {"t": {"0": 4}}) == {"t": {"0": 9}}


def test_a_batch_is_covered_only_when_every_partition_is_reached() -> None:
    reached = {"t": {"0": 10, "1": 4}}
    assert covers(reached, {"t": {"0": 10, "1": 3}})
    assert not covers(reached, {"t": {"0": 11}})
    assert not covers(reached, {"u": {"0": 1}})
    assert covers(reached, {})


def test_a_start_past_what_the_store_reached_is_a_gap() -> None:
    reached = {"t": {"0": 10}}
    assert gaps(reached, {"t": {"0": 10}}) == []
    assert gaps(reached, {"t": {"0": 7}}) == []
    assert gaps(reached, {"t": {"0": 12}}) == ["t[0] starts at 12, store reached 10"]
    assert gaps(reached, {"t": {"1": 50}}) == []  # a partition never reached starts anywhere


def test_applied_counts_only_count_changes_past_the_stored_position() -> None:
    assert applied_count(None, 0, Put("c", "k", 12, {}, (10, 12), fresh=True)) == 2
    assert applied_count(12, 2, Put("c", "k", 14, {}, (10, 12, 14), fresh=True)) == 3
    assert applied_count(14, 3, Put("c", "k", 30, {}, (25, 30), fresh=True)) == 2
    assert applied_count(14, 3, Put("c", "k", 20, {})) == 4


def test_two_writes_for_one_key_in_a_batch_are_a_fold_bug() -> None:
    check_unique([Put("a", "k", 1, {}), Put("b", "k", 1, {}), Delete("a", "j", 2)])
    with pytest.raises(ValueError, match="two writes for a/k"):
        check_unique([Put("a", "k", 1, {}), Delete("a", "k", 2)])


def test_json_fields_are_parsed_lazily_and_may_sit_in_a_member() -> None:
    whole = JsonObject('{"a": 1}')
    assert fields_json(whole) == '{"a": 1}' and dict(whole) == {"a": 1}
    inner = JsonObject('{"op": "c", "after": {"id": 2}}', member="after")
    assert dict(inner) == {"id": 2}
    assert fields_json(inner) == '{"id":2}'


# -- the write table and the vectorised guard -------------------------------------------------

positions = st.integers(min_value=0, max_value=40)


@st.composite
def a_write(draw: st.DrawFn, key: str) -> Write:
    position = draw(positions)
    if draw(st.booleans()):
        return Delete("c", key, position, SourceRef("t", 1, draw(positions)))
    earlier = draw(st.lists(st.integers(min_value=0, max_value=position), max_size=3))
    changes = tuple(sorted({*earlier, position})) if earlier else ()
    return Put("c", key, position, {"v": position}, changes, draw(st.booleans()))


@given(
    st.lists(
        st.tuples(
            st.none() | positions,  # the stored entry's position
            st.integers(min_value=0, max_value=5),  # its applied count
            st.none() | positions,  # the deleted key's tombstone position
        ),
        max_size=8,
    ),
    st.data(),
)
@settings(deadline=None)  # numpy and Arrow calls: milliseconds each on a busy machine
def test_the_vectorised_guard_is_the_rule_write_by_write(
    stored: list[tuple[int | None, int, int | None]], data: st.DataObject
) -> None:
    writes = [data.draw(a_write(f"k{i}")) for i in range(len(stored))]
    columns = WriteColumns.of(writes)
    passed, counts = guard(
        columns,
        np.array([NONE if s is None else s for s, _, _ in stored], dtype=np.int64),
        np.array([a for _, a, _ in stored], dtype=np.int64),
        np.array([NONE if t is None else t for _, _, t in stored], dtype=np.int64),
    )
    for i, (write, (position, applied, tomb)) in enumerate(zip(writes, stored, strict=True)):
        known = [p for p in (position, tomb) if p is not None]
        floor = max(known) if known else None
        assert passed[i] == (floor is None or write.position > floor)
        if passed[i] and isinstance(write, Put):
            assert counts[i] == applied_count(floor, 0 if position is None else applied, write)


def test_a_write_table_keeps_every_write() -> None:
    writes: list[Write] = [
        Put("a", "k", 12, {"x": 1}, (10, 12), fresh=True, source=SourceRef("t", 2, 7)),
        Put("a", "m", 3, JsonObject('{"op": "c", "after": {"id": 2}}', member="after")),
        Delete("b", "k", 5, SourceRef("t", 0, 9)),
    ]
    table = write_table(writes)
    assert table.schema == WRITE_SCHEMA
    columns = WriteColumns(table)
    assert columns.writes(range(3)) == writes
    assert columns.folded(0) == (10, 12) and columns.folded(1) == (3,)
    assert columns.collections == ["a", "b"] and list(columns.rows_of("b")) == [2]


def test_a_write_table_must_name_where_each_write_goes() -> None:
    with pytest.raises(ValueError, match="no column position"):
        WriteColumns(pa.table({"collection": ["a"], "key": ["k"]}))
    with pytest.raises(ValueError, match="key holds nulls"):
        WriteColumns(pa.table({"collection": ["a"], "key": [None], "position": [1]}))
    with pytest.raises(ValueError, match="two writes for a/k"):
        WriteColumns(
            pa.table({"collection": ["a", "a"], "key": ["k", "k"], "position": [1, 2]})
        ).check_unique()
