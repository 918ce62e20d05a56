"""The PostgreSQL event store: atomic appends with optimistic concurrency, stream and global reads.

**Appends.** ``append`` is one ``INSERT … SELECT FROM unnest(…)`` statement. It assigns the
versions ``expected_version + 1 …``; ``UNIQUE (stream_id, version)`` makes a second writer
with the same expected version fail (→ :class:`ConcurrencyError`), and a guard in the same
statement requires the row at ``expected_version`` to exist, so a stream never has a gap.
Being one statement, it is atomic on its own: outside a caller's transaction it runs in
autocommit mode, one round trip.

**Global order, and why ``read_all`` never skips.** ``position`` comes from an identity
sequence when the row is inserted, but transactions commit in another order: a reader that
resumed "after position 11" would miss position 10 committed a moment later. Two fixes
exist. A transaction-scoped lock taken by every append (the ``eventsourcing`` library's
``LOCK TABLE``) makes positions follow commit order, but serialises all writers *through
their commit*, WAL flush included: N writers run at the speed of one. Instead, each row
records its writer's transaction id and ``read_all``

1. returns only rows of transactions older than the oldest still running one
   (``transaction_id < pg_snapshot_xmin(pg_current_snapshot())``): such transactions are
   finished, so that set of rows can no longer grow; and
2. orders by ``(transaction_id, position)`` and resumes after such a pair
   (:class:`~event_store.event.Position`). Every transaction that can still commit has an
   id >= that horizon, hence sorts after anything already returned.

Writers pay nothing but a column and an index (the benchmark prints the cost); readers
wait at most as long as the oldest running write transaction in the cluster (keep write
transactions short; an idle-in-transaction session holds ``read_all`` back, never makes it
skip). Within a stream, versions ascend in this order because the writer of version n+1
must see version n committed; ``append`` checks that the head's transaction id is lower
than its own, which fails only when a caller wrote something else earlier in a
transaction that began before the head was committed.
"""

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Row,
    Text,
    cast,
    func,
    select,
    text,
    tuple_,
)
from sqlalchemy.exc import IntegrityError

from event_store.errors import ConcurrencyError, EventStoreError
from event_store.event import NewEvent, Position, RecordedEvent
from event_store.schema import DEFAULT_SCHEMA, StoreTables
from event_store.upcasting import Upcasters


@dataclass(frozen=True)
class AppendResult:
    """What an append stored: the stream's new version and each event's id and position."""

    stream_id: str
    version: int
    event_ids: tuple[str, ...]
    positions: tuple[Position, ...]

    @property
    def position(self) -> Position | None:
        """The position of the last appended event."""
        return self.positions[-1] if self.positions else None


class EventStore:
    """Append to and read from the ``events`` table of one store schema."""

    def __init__(
        self, engine: Engine, schema: str = DEFAULT_SCHEMA, upcasters: Upcasters | None = None
    ) -> None:
        self.engine = engine
        self.tables = StoreTables(schema)
        self.upcasters = upcasters
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        s = self.tables.schema
        self._append_sql = text(
            f"""
            INSERT INTO {s}.events (event_id, stream_id, stream_type, version, event_type,
                                    schema_version, data, metadata)
            SELECT e.event_id, :stream_id, :stream_type, :expected + e.ord::integer,
                   e.event_type, e.schema_version, e.data, e.metadata
            FROM unnest(CAST(:event_ids AS uuid[]), CAST(:event_types AS text[]),
                        CAST(:schema_versions AS integer[]), CAST(:data AS jsonb[]),
                        CAST(:metadata AS jsonb[]))
                 WITH ORDINALITY AS e(event_id, event_type, schema_version, data, metadata, ord)
            WHERE :expected = 0 OR EXISTS (
                SELECT 1 FROM {s}.events h
                WHERE h.stream_id = :stream_id AND h.version = :expected
                  AND h.transaction_id < pg_current_xact_id()::text::bigint)
            RETURNING transaction_id, position
            """
        )

    @contextmanager
    def _connection(self, connection: Connection | None, autocommit: bool) -> Iterator[Connection]:
        if connection is not None:
            yield connection
            return
        engine = self._autocommit if autocommit else self.engine
        with engine.connect() as conn:
            yield conn

    # -- writing -----------------------------------------------------------------------

    def append(
        self,
        stream_id: str,
        events: Sequence[NewEvent],
        expected_version: int,
        *,
        stream_type: str,
        connection: Connection | None = None,
    ) -> AppendResult:
        """Append ``events`` to a stream that must stand at ``expected_version`` (0: new).

        Atomic: all events or none. Raises :class:`ConcurrencyError` when the stream is
        elsewhere. Pass ``connection`` to append inside your own transaction (it then
        commits or rolls back with it; after an error, roll it back).
        """
        if expected_version < 0:
            raise ValueError(f"expected_version must be >= 0, got {expected_version}")
        if not events:
            return AppendResult(stream_id, expected_version, (), ())
        params = {
            "stream_id": stream_id,
            "stream_type": stream_type,
            "expected": expected_version,
            "event_ids": [e.event_id for e in events],
            "event_types": [e.event_type for e in events],
            "schema_versions": [e.schema_version for e in events],
            "data": [json.dumps(e.data) for e in events],
            "metadata": [json.dumps(e.metadata) for e in events],
        }
        with self._connection(connection, autocommit=True) as conn:
            try:
                rows = conn.execute(self._append_sql, params).all()
            except IntegrityError as exc:
                constraint = getattr(getattr(exc.orig, "diag", None), "constraint_name", None)
                if constraint == "events_stream_version_key":
                    raise ConcurrencyError(stream_id, expected_version, None) from exc
                raise EventStoreError(f"append to {stream_id!r} failed: {exc.orig}") from exc
            if not rows:
                actual = None if connection is not None else self.stream_version(stream_id, conn)
                raise ConcurrencyError(stream_id, expected_version, actual)
        positions = tuple(sorted(Position(int(r[0]), int(r[1])) for r in rows))
        return AppendResult(
            stream_id,
            expected_version + len(events),
            tuple(str(e.event_id) for e in events),
            positions,
        )

    # -- reading -----------------------------------------------------------------------

    def stream_version(self, stream_id: str, connection: Connection | None = None) -> int:
        """The version of the stream's last committed event (0 when it has none)."""
        t = self.tables.events
        query = select(func.coalesce(func.max(t.c.version), 0)).where(t.c.stream_id == stream_id)
        with self._connection(connection, autocommit=True) as conn:
            return int(conn.execute(query).scalar_one())

    def read_stream(
        self,
        stream_id: str,
        from_version: int = 1,
        to_version: int | None = None,
        connection: Connection | None = None,
    ) -> list[RecordedEvent]:
        """The stream's events from ``from_version`` (inclusive), in version order, upcast."""
        t = self.tables.events
        query = select(t).where(t.c.stream_id == stream_id, t.c.version >= from_version)
        if to_version is not None:
            query = query.where(t.c.version <= to_version)
        with self._connection(connection, autocommit=True) as conn:
            rows = conn.execute(query.order_by(t.c.version)).all()
        return [self._recorded(r) for r in rows]

    def read_all(
        self,
        after: Position | None = None,
        limit: int = 1000,
        connection: Connection | None = None,
    ) -> list[RecordedEvent]:
        """Up to ``limit`` committed events after ``after``, in global order, upcast.

        Resume with the last event's ``position``; see the module docstring for why this
        never skips an event that commits later.
        """
        t = self.tables.events
        horizon = cast(cast(func.pg_snapshot_xmin(func.pg_current_snapshot()), Text), BigInteger)
        query = select(t).where(t.c.transaction_id < horizon)
        if after is not None:
            query = query.where(
                tuple_(t.c.transaction_id, t.c.position)
                > tuple_(after.transaction_id, after.sequence)
            )
        query = query.order_by(t.c.transaction_id, t.c.position).limit(limit)
        with self._connection(connection, autocommit=True) as conn:
            rows = conn.execute(query).all()
        return [self._recorded(r) for r in rows]

    def _recorded(self, row: Row[Any]) -> RecordedEvent:
        m = row._mapping
        event = RecordedEvent(
            event_id=m["event_id"],
            stream_id=m["stream_id"],
            stream_type=m["stream_type"],
            version=m["version"],
            event_type=m["event_type"],
            schema_version=m["schema_version"],
            data=m["data"],
            metadata=m["metadata"],
            recorded_at=m["recorded_at"],
            position=Position(m["transaction_id"], m["position"]),
        )
        return event if self.upcasters is None else self.upcasters.upcast(event)
