"""Comparing generations: the digest is stable and sees every change of fields or position; the
comparison lists what differs with both entries; a listing a batch spoilt is read again."""

from collections.abc import Iterator

import pytest

from connectors.errors import StoreError
from connectors.stores.compare import (
    compare_generations,
    entry_digest,
    same_offsets,
    scan_digests,
)
from tributary.view_model import Commit, Entry


def entry(key: str, fields: dict[str, object], position: int = 1, applied: int = 1) -> Entry:
    return Entry("items", key, fields, position, applied)


def test_the_digest_is_of_fields_and_position_not_of_order_or_applied_count() -> None:
    one = entry("a", {"x": 1, "y": [1, 2]}, 5, 3)
    assert entry_digest(one) == entry_digest(entry("a", {"y": [1, 2], "x": 1}, 5, 1))
    assert entry_digest(one) != entry_digest(entry("a", {"x": 2, "y": [1, 2]}, 5, 3))
    assert entry_digest(one) != entry_digest(entry("a", {"x": 1, "y": [1, 2]}, 6, 3))
    assert entry_digest(one) != entry_digest(entry("a", {"x": "1", "y": [1, 2]}, 5, 3))


def test_same_offsets_counts_a_missing_partition_as_zero() -> None:
    assert same_offsets({"t": {"0": 3, "1": 0}}, {"t": {"0": 3}})
    assert not same_offsets({"t": {"0": 3}}, {"t": {"0": 4}})
    assert not same_offsets({"t": {"0": 3}}, {"t": {"0": 3}, "u": {"0": 1}})


class Fake:
    """Two generations in memory; ``moves`` batches commit during the first listings."""

    view = "v"
    kind = "fake"

    def __init__(self, data: dict[str, dict[str, Entry]], moves: int = 0) -> None:
        self.data = data
        self.moves = moves
        self.reads = 0

    def committed(self, generation: str) -> Commit:
        self.reads += 1
        batch = self.reads // 2 if self.moves and self.reads <= 2 * self.moves else 0
        return Commit("v", generation, batch, {"t": {"0": 1}}, batch + 1)

    def digests(self, generation: str | None = None) -> Iterator[tuple[str, str, str]]:
        assert generation is not None
        return scan_digests(lambda _c, g: list(self.data[g].values()), ["items"], generation)

    def get(self, collection: str, key: str, generation: str | None = None) -> Entry | None:
        assert generation is not None
        return self.data[generation].get(key)


def test_differences_are_listed_by_key_with_both_entries() -> None:
    live = {k: entry(k, {"v": 1}) for k in "abc"}
    shadow = {k: entry(k, {"v": 1}) for k in "bcd"}
    shadow["c"] = entry("c", {"v": 2})
    found = compare_generations(Fake({"live": live, "shadow": shadow}), "live", "shadow")
    assert (found.live_entries, found.shadow_entries, found.different) == (3, 3, 3)
    assert [(d.key, d.kind) for d in found.differences] == [
        ("a", "missing in shadow"),
        ("c", "different"),
        ("d", "missing in live"),
    ]
    assert found.differences[1].as_dict()["live"] == {"fields": {"v": 1}, "position": 1}
    assert found.differences[1].as_dict()["shadow"] == {"fields": {"v": 2}, "position": 1}
    assert not found.identical and found.same_positions
    same = compare_generations(Fake({"live": live, "shadow": dict(live)}), "live", "shadow")
    assert same.identical and same.differences == []


def test_a_listing_during_which_a_batch_committed_is_read_again() -> None:
    live = {"a": entry("a", {"v": 1})}
    store = Fake({"live": live, "shadow": dict(live)}, moves=2)
    assert compare_generations(store, "live", "shadow").identical
    with pytest.raises(StoreError, match="changed during each"):
        compare_generations(Fake({"live": live, "shadow": live}, moves=99), "live", "shadow")


def test_a_stateful_view_is_compared_by_fields_its_positions_follow_its_batches() -> None:
    live = {"a": entry("a", {"v": 1}, 5), "b": entry("b", {"v": 1}, 5), "c": entry("c", {"v": 1})}
    shadow = {"a": entry("a", {"v": 1}, 9), "b": entry("b", {"v": 2}, 5), "d": entry("d", {})}
    store = Fake({"live": live, "shadow": shadow})
    every = compare_generations(store, "live", "shadow")
    assert [(d.key, d.kind) for d in every.differences] == [
        ("a", "different"),  # the same fields at another position
        ("b", "different"),
        ("c", "missing in shadow"),
        ("d", "missing in live"),
    ]
    by_fields = compare_generations(store, "live", "shadow", positions=False)
    assert [(d.key, d.kind) for d in by_fields.differences] == [
        ("b", "different"),
        ("c", "missing in shadow"),
        ("d", "missing in live"),
    ]
    assert by_fields.different == 3
