"""The command bus's LRU cache (event_store.lru)."""

import pytest

from event_store.lru import Lru


def test_the_least_recently_used_entry_goes_first_and_a_read_counts_as_a_use() -> None:
    cache: Lru[str, int] = Lru(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "b" is now the least recently used
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (1, None, 3)
    assert len(cache) == 2


def test_replaces_decides_whether_a_held_entry_is_replaced_and_it_is_used_either_way() -> None:
    cache: Lru[str, int] = Lru(2)
    cache.put("a", 5)
    cache.put("b", 1)
    cache.put("a", 3, replaces=lambda old: old < 3)  # kept: 5, but "a" was used
    assert cache.get("a") == 5
    cache.put("a", 7, replaces=lambda old: old < 7)
    cache.put("c", 0)  # "b" was the least recently used
    assert (cache.get("a"), cache.get("b")) == (7, None)


def test_dropped_keys_are_gone_size_zero_holds_nothing_and_a_negative_size_is_refused() -> None:
    cache: Lru[str, int] = Lru(3)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.drop(["a", "z"])
    assert (cache.get("a"), cache.get("b")) == (None, 2)
    empty: Lru[str, int] = Lru(0)
    empty.put("a", 1)
    assert (empty.get("a"), len(empty)) == (None, 0)
    with pytest.raises(ValueError, match="cache size must be >= 0"):
        Lru(-1)
