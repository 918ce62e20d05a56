"""What the jobs built on Spark's ``transformWithState`` share: folded output rows, the rows
of records beyond the allowed lateness, of records the decoder refused and of subjects
forgotten (each processor takes every record of its input, so a job's plan reads its topics
once: a second branch off the source would read and decode them again), and a per-key
revision counter (the position of every entry a key's processor writes)."""

import json
from typing import Any

from projections.time import LATE, iso_ms
from tributary.view_model import WRITE_COLUMNS

#: The collection of users forgotten (key: the user id; from ``SubjectForgotten`` on
#: ``events.subject``), which each job's materializer purges its outputs of
#: (:func:`examples.social.analytics.common.forgetting`); the input rows' ``kind`` for them.
FORGOTTEN = "forgotten"

FOLDED_FIELDS = (*WRITE_COLUMNS, "error", "raw_key", "raw_value")
"""A processor's output row: the write table's columns, then a refused record's reason and
bytes (the dead-letter columns)."""


LATE_FIELDS = (
    "kind",
    "event_id",
    "event_time",
    "sent_time",
    "received_time",
    "corrected_time",
    "delay_ms",
    "topic",
    "partition",
    "offset",
)
"""The input columns a ``late`` entry keeps (with the job's name), as
:func:`projections.time.late_and_rejected` does in Spark."""
LATE_INPUT = (*LATE_FIELDS, "beyond", "error", "raw_key", "raw_value")
"""The input columns a processor needs for :func:`late_values`."""


def _plain(value: Any) -> Any:
    """A pandas cell as JSON-ready Python (numpy numbers as ints, missing as None)."""
    if value is None:
        return None
    try:
        if value != value:  # NaN
            return None
    except (TypeError, ValueError):
        return value
    return value.item() if hasattr(value, "item") else value


def _whole(value: Any) -> Any:
    """An integer cell (None when missing), even from a column pandas made float."""
    plain = _plain(value)
    return None if plain is None else int(plain)


def passing(frame: Any) -> Any:
    """The rows of a processor's input that pass through it (:func:`late_values`) instead of
    feeding its state: beyond the allowed lateness, refused by the decoder, or forgotten."""
    return (
        frame["beyond"].fillna(False).astype(bool)
        | frame["error"].notna()
        | (frame["kind"] == FORGOTTEN).fillna(False).astype(bool)
    )


def to_every_key(forget: Any, keys: int, key: Any) -> Any:
    """The group key of a processor's input rows (a Spark column, to ``explode``): ``key``, or
    for a row where ``forget`` holds, each of the keys ``0 .. keys - 1`` (the forget reaches
    every group of an operator whose groups are not the user's; the copies beyond key 0 are
    its ``echo``, which only purges)."""
    from pyspark.sql import functions as F

    return F.explode(F.when(forget, F.sequence(F.lit(0), F.lit(keys - 1))).otherwise(F.array(key)))


def forgotten_users(frame: Any) -> set[int]:
    """The users a processor's input rows say are forgotten."""
    picked = frame[(frame["kind"] == FORGOTTEN).fillna(False).astype(bool) & frame["error"].isna()]
    return {int(u) for u in picked["user_id"].dropna()}


def forgotten_put(user_id: int) -> dict[str, Any]:
    """The folded Put of a forgotten user's entry (position 1: forgotten once)."""
    return put_values(FORGOTTEN, str(user_id), 1, {"subject_type": "user", "user_id": user_id})


def late_values(frame: Any, job: str) -> list[dict[str, Any]]:
    """The folded rows of a processor's input records that are beyond the allowed lateness (an
    entry of the job's ``late`` collection, keyed ``<kind>:<event id>``, so a re-sent record
    counts once) or that the decoder refused (a rejection: the job's dead letter), and an
    entry of the ``forgotten`` collection per forgotten user (the frame has ``user_id`` then).
    One row per such record: they are few."""
    out: list[dict[str, Any]] = []
    forgotten = (frame["kind"] == FORGOTTEN).fillna(False).astype(bool) & frame["error"].isna()
    for user_id in sorted(forgotten_users(frame)) if forgotten.any() else ():
        out.append(forgotten_put(user_id))
    picked = frame[frame["beyond"].fillna(False).astype(bool) | frame["error"].notna()]
    for row in picked[list(LATE_INPUT)].itertuples(index=False):
        values: dict[str, Any] = dict.fromkeys(FOLDED_FIELDS)
        values.update(
            topic=_plain(row.topic), partition=_whole(row.partition), offset=_whole(row.offset)
        )
        if _plain(row.error) is not None:
            values.update(error=row.error, raw_key=row.raw_key, raw_value=row.raw_value)
        else:
            fields = {"job": job}
            for name in LATE_FIELDS:
                value = _plain(getattr(row, name))
                if isinstance(value, float) and value.is_integer():
                    # an integer column that pandas made float (a row of the group had a null:
                    # a dead letter, a forgotten user's row): written as the integer it is
                    value = int(value)
                if value is not None:  # as Spark's to_json: null fields left out
                    fields[name] = value
            values.update(
                collection=LATE,
                key=":".join(str(v) for v in (row.kind, row.event_id) if v is not None),
                position=1,
                deleted=False,
                fields=json.dumps(fields, separators=(",", ":")),
                fresh=False,
            )
        out.append(values)
    return out


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
