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

import psycopg
from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Row,
    Text,
    cast,
    func,
    select,
    tuple_,
)

from event_store.errors import (
    ConcurrencyError,
    EventStoreError,
    SchemaMissingError,
    StorageError,
)
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


class AppendStatements:
    """The four append statements: one event or many, to a new stream or an existing one.

    Appends run on the psycopg connection under the SQLAlchemy one (same connection, same
    transaction): on the hot path SQLAlchemy's statement layer costs as much as the
    database, and these statements need nothing from it. A single event is a plain
    ``INSERT … VALUES``; many go in one ``INSERT … SELECT FROM unnest(arrays)`` with the
    arrays sent in binary format (the text format escapes every JSON string with a regex,
    which was half the cost of a 1,000-event append). Appending to an existing stream adds
    the guard that version ``expected`` exists and was written by an older transaction; a
    new stream needs no guard (``UNIQUE (stream_id, version)`` refuses a second version 1).
    """

    COLUMNS = (
        "event_id, stream_id, stream_type, version, event_type, schema_version, data, metadata"
    )

    def __init__(self, schema: str) -> None:
        table = f"{schema}.events"
        guard = (
            f"WHERE EXISTS (SELECT 1 FROM {table} h WHERE h.stream_id = %(stream_id)s "
            "AND h.version = %(expected)s "
            "AND h.transaction_id < pg_current_xact_id()::text::bigint)"
        )
        returning = "RETURNING transaction_id, position"
        one = (
            "%(event_id)s, %(stream_id)s, %(stream_type)s, %(version)s::integer, "
            "%(event_type)s, %(schema_version)s::integer, %(data)s::jsonb, %(metadata)s::jsonb"
        )
        many = """SELECT e.event_id, %(stream_id)s, %(stream_type)s,
                   %(expected)s::integer + e.ord::integer, e.event_type, e.schema_version,
                   e.data, e.metadata
            FROM unnest(%(event_ids)b::uuid[], %(event_types)b::text[],
                        %(schema_versions)b::integer[], %(data)b::jsonb[], %(metadata)b::jsonb[])
                 WITH ORDINALITY AS e(event_id, event_type, schema_version, data, metadata, ord)"""
        insert = f"INSERT INTO {table} ({self.COLUMNS})"
        self.one_new = f"{insert} VALUES ({one}) {returning}"
        self.one_guarded = f"{insert} SELECT {one} {guard} {returning}"
        self.many_new = f"{insert} {many} {returning}"
        self.many_guarded = f"{insert} {many} {guard} {returning}"

    def for_append(
        self, stream_id: str, stream_type: str, events: Sequence[NewEvent], expected: int
    ) -> tuple[dict[str, Any], str]:
        """Parameters and statement for one append."""
        params: dict[str, Any] = {
            "stream_id": stream_id,
            "stream_type": stream_type,
            "expected": expected,
        }
        if len(events) == 1:
            [event] = events
            params.update(
                event_id=event.event_id,
                version=expected + 1,
                event_type=event.event_type,
                schema_version=event.schema_version,
                data=json.dumps(event.data),
                metadata=json.dumps(event.metadata),
            )
            return params, self.one_guarded if expected else self.one_new
        params.update(
            event_ids=[e.event_id for e in events],
            event_types=[e.event_type for e in events],
            schema_versions=[e.schema_version for e in events],
            data=[json.dumps(e.data) for e in events],
            metadata=[json.dumps(e.metadata) for e in events],
        )
        return params, self.many_guarded if expected else self.many_new


class EventStore:
    """Append to and read from the ``events`` table of one store schema."""

    def __init__(
        self, engine: Engine, schema: str = DEFAULT_SCHEMA, upcasters: Upcasters | None = None
    ) -> None:
        self.engine = engine
        self.tables = StoreTables(schema)
        self.upcasters = upcasters
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._sql = AppendStatements(self.tables.schema)

    @contextmanager
    def _connection(self, connection: Connection | None, autocommit: bool) -> Iterator[Connection]:
        if connection is not None:
            yield connection
            return
        engine = self._autocommit if autocommit else self.engine
        with engine.connect() as conn:
            yield conn

    @contextmanager
    def _driver(self, connection: Connection | None) -> Iterator[psycopg.Connection[Any]]:
        """The psycopg connection under ``connection``, or a pooled one in autocommit mode.

        A pooled one is taken with ``raw_connection()``: a single-statement append needs
        neither a transaction nor SQLAlchemy's Connection (whose set-up costs as much CPU
        as the insert). Autocommit is switched off again before the pool gets it back.
        """
        if connection is not None:
            driver = connection.connection.driver_connection
            if not isinstance(driver, psycopg.Connection):
                raise EventStoreError("the event store needs the psycopg 3 driver")
            yield driver
            return
        raw = self.engine.raw_connection()
        try:
            driver = raw.driver_connection
            if not isinstance(driver, psycopg.Connection):
                raise EventStoreError("the event store needs the psycopg 3 driver")
            driver.autocommit = True
            try:
                yield driver
            finally:
                driver.autocommit = False
        finally:
            raw.close()

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
        params, statement = self._sql.for_append(stream_id, stream_type, events, expected_version)
        with self._driver(connection) as driver:
            try:
                with driver.cursor() as cursor:
                    cursor.execute(statement, params)
                    rows = cursor.fetchall()
            except psycopg.errors.UniqueViolation as exc:
                if exc.diag.constraint_name == "events_stream_version_key":
                    raise ConcurrencyError(stream_id, expected_version, None) from exc
                raise StorageError(f"append to {stream_id!r} failed: {exc}", exc.sqlstate) from exc
            except psycopg.errors.UndefinedTable as exc:
                raise SchemaMissingError(
                    f"{self.tables.schema}.events does not exist: create it with "
                    "event_store.create_schema (`tributary run-commands` does)",
                    exc.sqlstate,
                ) from exc
            except psycopg.Error as exc:
                raise StorageError(f"append to {stream_id!r} failed: {exc}", exc.sqlstate) from exc
        if not rows:
            actual = None if connection is not None else self.stream_version(stream_id)
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
        event = RecordedEvent.from_columns([m[c] for c in RecordedEvent.COLUMNS])
        return event if self.upcasters is None else self.upcasters.upcast(event)
