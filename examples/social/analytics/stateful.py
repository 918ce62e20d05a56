"""What the jobs built on Spark's ``transformWithState`` share: folded output rows and a
per-key revision counter (the position of every entry a key's processor writes)."""

import json
from typing import Any

from projections.time import iso_ms

FOLDED_FIELDS = (
    "collection",
    "key",
    "position",
    "deleted",
    "fields",
    "member",
    "changes",
    "fresh",
    "topic",
    "partition",
    "offset",
    "error",
    "raw_key",
    "raw_value",
)


def put_row(collection: str, key: str, position: int, fields: dict[str, Any]) -> Any:
    """A folded Put as a Spark ``Row``."""
    from pyspark.sql import Row

    values = dict.fromkeys(FOLDED_FIELDS)
    values.update(
        collection=collection,
        key=key,
        position=position,
        deleted=False,
        fields=json.dumps(fields, separators=(",", ":")),
        fresh=False,
    )
    return Row(**values)


def delete_row(collection: str, key: str, position: int) -> Any:
    """A folded Delete as a Spark ``Row``."""
    from pyspark.sql import Row

    values = dict.fromkeys(FOLDED_FIELDS)
    values.update(collection=collection, key=key, position=position, deleted=True, fresh=False)
    return Row(**values)


class Revisions:
    """A key's output positions: one counter in the key's state, +1 per entry written."""

    SCHEMA = "revision long"

    def __init__(self, handle: Any, name: str = "revision") -> None:
        self.state = handle.getValueState(name, self.SCHEMA)
        self._next: int | None = None

    def next(self) -> int:
        if self._next is None:
            current = self.state.get() if self.state.exists() else None
            self._next = (int(current[0]) if current else 0) + 1
        value = self._next
        self._next += 1
        return value

    def save(self) -> None:
        if self._next is not None:
            self.state.update((self._next - 1,))
            self._next = None

    def clear(self) -> None:
        self.state.clear()
        self._next = None


def replace_timer(handle: Any, at: int | None) -> None:
    """Keep exactly one timer for the key, at ``at`` (none when ``at`` is None)."""
    for existing in list(handle.listTimers()):
        if existing != at:
            handle.deleteTimer(existing)
    if at is not None and at not in set(handle.listTimers()):
        handle.registerTimer(at)


def iso(ms: int) -> str:
    return iso_ms(ms)
