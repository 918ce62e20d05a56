"""The mirror view: the latest row per primary key of a CDC topic; deletes remove the row.

:func:`decode_change` turns a Kafka record into a :class:`ChangeEvent`; :class:`MirrorProjection`
folds one batch of changes into at most one :class:`MirrorWrite` per key. The fold drops stale
changes (position at or below the key's last in the batch); the sink drops writes at or below the
position it already holds, so re-sent records change nothing.
"""

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from connectors.changes import ChangeEvent, Row
from projections.errors import RecordRejectedError
from projections.positions import PositionGuard, key_id
from projections.view import KafkaRecord


def decode_change(record: KafkaRecord) -> ChangeEvent:
    """Decode a Debezium record; raises ``ChangeDecodeError`` for anything else."""
    return ChangeEvent.from_kafka(record.topic, record.key, record.value, record.headers)


@dataclass
class MirrorWrite:
    """The net effect of one batch on one key.

    ``row`` is the row to hold (None: delete the key). ``position`` is the last change's LSN.
    ``applied`` are the positions of the changes that built the current row in this batch, and
    ``fresh`` says the row was (re)created in this batch, so its applied-count restarts.
    """

    key: Row
    row: Row | None
    position: int
    fresh: bool = False
    applied: list[int] = field(default_factory=list)

    @property
    def is_delete(self) -> bool:
        return self.row is None


class MirrorProjection:
    """Folds a batch of changes (in log order) into one write per key."""

    def __call__(
        self,
        items: Sequence[tuple[KafkaRecord, ChangeEvent]],
        reject: Callable[[KafkaRecord, BaseException], None],
    ) -> list[MirrorWrite]:
        guard = PositionGuard()
        writes: dict[Hashable, MirrorWrite] = {}
        for record, change in items:
            try:
                self._fold(writes, guard, change)
            except RecordRejectedError as exc:
                reject(record, exc)
        return list(writes.values())

    def _fold(
        self, writes: dict[Hashable, MirrorWrite], guard: PositionGuard, change: ChangeEvent
    ) -> None:
        if change.is_tombstone and change.source is None:
            return  # a tombstone without position only confirms a delete already seen
        position = change.position
        kid = _key_identity(change.key)
        # A tombstone repeats its delete's LSN, so the guard drops it after that delete.
        if not guard.admit(kid, position):
            return
        if change.is_delete:
            writes[kid] = MirrorWrite(change.key, None, position, fresh=False, applied=[])
            return
        row = _checked_row(change)
        previous = writes.get(kid)
        if change.op in ("c", "r") or (previous is not None and previous.is_delete):
            writes[kid] = MirrorWrite(change.key, row, position, fresh=True, applied=[position])
        elif previous is None:
            writes[kid] = MirrorWrite(change.key, row, position, fresh=False, applied=[position])
        else:
            previous.row, previous.position = row, position
            previous.applied.append(position)


def _key_identity(key: Row) -> Hashable:
    """A hashable identity of a key: its sorted items, or its canonical JSON for nested values."""
    try:
        identity = tuple(sorted(key.items()))
        hash(identity)
    except TypeError:
        return key_id(key)
    return identity


def _checked_row(change: ChangeEvent) -> Row:
    row: Any = change.after
    if change.op not in ("c", "r", "u"):
        raise RecordRejectedError(f"op {change.op!r} does not change a row; cannot mirror it")
    if not isinstance(row, dict):
        raise RecordRejectedError(f"op {change.op!r} without an 'after' row object")
    missing = [column for column in change.key if column not in row]
    if missing:
        raise RecordRejectedError(f"'after' lacks the key column(s) {missing}")
    return row
