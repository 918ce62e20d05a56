"""A thread-safe least-recently-used cache: the command bus's aggregate states and subjects'
keys (:class:`cachetools.LRUCache` under a lock; size 0 caches nothing)."""

import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

from cachetools import LRUCache

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"cache size must be >= 0, got {size}")
        self.size = size
        self._entries: LRUCache[K, V] = LRUCache(maxsize=max(size, 1))
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value of ``key`` (now the most recently used), or None."""
        with self._lock:
            return self._entries.get(key)

    def put(self, key: K, value: V, replaces: Callable[[V], bool] | None = None) -> None:
        """Hold ``value`` for ``key``; with ``replaces``, an entry already held is replaced only
        when ``replaces(old)`` is true (it is marked used either way)."""
        if self.size == 0:
            return
        with self._lock:
            old = self._entries.get(key)
            if old is None or replaces is None or replaces(old):
                self._entries[key] = value

    def drop(self, keys: Iterable[K]) -> None:
        with self._lock:
            for key in keys:
                self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)
