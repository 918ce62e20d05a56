"""Snapshots: an aggregate's state at a version, so a load need not replay the whole stream.

A snapshot is a cache: it lives in its own table, is replaced in place, and is ignored when
the aggregate's ``snapshot_version`` changed (the stream is then replayed from the start).
"""

from dataclasses import dataclass

from sqlalchemy import Connection, func, select
from sqlalchemy.dialects.postgresql import insert

from event_store.aggregate import Aggregate
from event_store.event import JsonObject
from event_store.schema import StoreTables


@dataclass(frozen=True)
class SnapshotPolicy:
    """Take a snapshot each time a stream crosses a multiple of ``every`` events (0: never)."""

    every: int = 100

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ValueError(f"snapshot interval must be >= 0, got {self.every}")

    def due(self, old_version: int, new_version: int) -> bool:
        return self.every > 0 and new_version // self.every > old_version // self.every


@dataclass(frozen=True)
class Snapshot:
    """A stored snapshot row."""

    stream_id: str
    stream_type: str
    version: int
    snapshot_version: int
    state: JsonObject


class SnapshotStore:
    """Reads and replaces snapshots in the ``snapshots`` table."""

    def __init__(self, tables: StoreTables) -> None:
        self.table = tables.snapshots

    def load(self, connection: Connection, stream_id: str) -> Snapshot | None:
        t = self.table
        row = connection.execute(select(t).where(t.c.stream_id == stream_id)).first()
        if row is None:
            return None
        m = row._mapping
        return Snapshot(
            m["stream_id"], m["stream_type"], m["version"], m["snapshot_version"], m["state"]
        )

    def save(self, connection: Connection, aggregate: Aggregate[object], version: int) -> None:
        """Store ``aggregate``'s current state as of ``version`` (never moves backwards)."""
        t = self.table
        statement = insert(t).values(
            stream_id=aggregate.stream_id,
            stream_type=aggregate.stream_type,
            version=version,
            snapshot_version=aggregate.snapshot_version,
            state=aggregate.snapshot_state(),
            taken_at=func.now(),
        )
        statement = statement.on_conflict_do_update(
            index_elements=[t.c.stream_id],
            set_={
                "version": statement.excluded.version,
                "snapshot_version": statement.excluded.snapshot_version,
                "state": statement.excluded.state,
                "taken_at": statement.excluded.taken_at,
            },
            where=t.c.version < statement.excluded.version,
        )
        connection.execute(statement)
