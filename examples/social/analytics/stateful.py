"""What the jobs built on Spark's ``transformWithState`` share: folded output rows and a
per-key revision counter (the position of every entry a key's processor writes)."""

import json
from datetime import UTC, datetime
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


def put_values(collection: str, key: str, position: int, fields: dict[str, Any]) -> dict[str, Any]:
    """A folded Put as a dict of the folded columns (a pandas processor's output row)."""
    values: dict[str, Any] = dict.fromkeys(FOLDED_FIELDS)
    values.update(
        collection=collection,
        key=key,
        position=position,
        deleted=False,
        fields=json.dumps(fields, separators=(",", ":")),
        fresh=False,
    )
    return values


def delete_values(collection: str, key: str, position: int) -> dict[str, Any]:
    """A folded Delete as a dict of the folded columns."""
    values: dict[str, Any] = dict.fromkeys(FOLDED_FIELDS)
    values.update(collection=collection, key=key, position=position, deleted=True, fresh=False)
    return values


def put_row(
    collection: str, key: str, position: int, fields: dict[str, Any], ts: int | None = None
) -> Any:
    """A folded Put as a Spark ``Row`` (``ts``: an event-time column in ms, for a processor
    whose output feeds another stateful operator)."""
    from pyspark.sql import Row

    values = put_values(collection, key, position, fields)
    if ts is not None:
        values["ts"] = datetime.fromtimestamp(ts / 1000, tz=UTC)
    return Row(**values)


def delete_row(collection: str, key: str, position: int) -> Any:
    """A folded Delete as a Spark ``Row``."""
    from pyspark.sql import Row

    return Row(**delete_values(collection, key, position))


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
