"""Per-key position guards and the ledger's offset merge."""

from projections.ledger import merge_offsets
from projections.positions import PositionGuard, key_id


def test_a_position_at_or_below_the_last_is_stale() -> None:
    guard = PositionGuard({"a": 10})
    assert not guard.admit("a", 10)
    assert not guard.admit("a", 9)
    assert guard.admit("a", 11)
    assert guard.admit("b", 1)
    assert guard.last("a") == 11


def test_key_ids_ignore_column_order() -> None:
    assert key_id({"a": 1, "b": "x"}) == key_id({"b": "x", "a": 1})
    assert key_id({"a": 1}) != key_id({"a": 2})


def test_offsets_merge_keeps_untouched_partitions_and_never_goes_back() -> None:
    merged = merge_offsets({"t": {"0": 5, "1": 9}}, {"t": {"1": 12, "2": 3}, "u": {"0": 1}})
    assert merged == {"t": {"0": 5, "1": 12, "2": 3}, "u": {"0": 1}}
    assert merge_offsets({"t": {"0": 9}}, {"t": {"0": 4}}) == {"t": {"0": 9}}
