"""The store model's pure rules: offsets reached, gaps, applied counts, one write per key."""

import pytest

from connectors.stores.model import (
    Delete,
    JsonObject,
    Put,
    applied_count,
    check_unique,
    covers,
    fields_json,
    gaps,
    merge_offsets,
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
