"""Per-key position guards: a record at or below the last applied position of its key is stale.

Positions only grow per key (the LSN of a change, the version of an aggregate), so a
redelivered or re-sent record is recognised by its position alone. Sinks keep the guard in
their store; :class:`PositionGuard` is the in-memory form used while folding one batch.
"""

import json
from collections.abc import Hashable, Mapping
from typing import Any


def key_id(key: Mapping[str, Any]) -> str:
    """A canonical text form of a key (sorted JSON), equal for equal keys."""
    return json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)


class PositionGuard:
    """Remembers the highest position seen per key and tells whether a new one is fresh."""

    def __init__(self, known: Mapping[Hashable, int] | None = None) -> None:
        self._last: dict[Hashable, int] = dict(known or {})

    def admit(self, key: Hashable, position: int) -> bool:
        """True (and remembered) when ``position`` is above the key's last; False if stale."""
        last = self._last.get(key)
        if last is not None and position <= last:
            return False
        self._last[key] = position
        return True

    def last(self, key: Hashable) -> int | None:
        return self._last.get(key)
