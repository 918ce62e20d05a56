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

**Reads** (:mod:`event_store.reading`): a ``read_all`` page is one statement, planned as
the index scan whatever the statistics, streamed in chunks and turned into events straight
from C-loaded columns, each keeping its id, time, JSON and position encoded until used;
:meth:`EventStore.read_batches` returns the same rows as Arrow record batches, no Python
object per event.
"""

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from sqlalchemy import Connection, Engine, func, select

from event_store import prepared
from event_store.errors import (
    ConcurrencyError,
    EventStoreError,
    SchemaMissingError,
    StorageError,
)
from event_store.event import NewEvent, Position, RecordedEvent
from event_store.prepared import Statement, StatementsLost, int8
from event_store.reading import (
    EventQueries,
    JsonPage,
    arrow_batch,
    check_columns,
    fetch_events,
    last_position,
    page_params,
    page_rows,
    read_page,
    selected_columns,
    stream_params,
    upcast_all,
)
from event_store.schema import DEFAULT_SCHEMA, StoreTables
from event_store.upcasting import Upcasters

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]


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

    @classmethod
    def of(
        cls,
        stream_id: str,
        events: Sequence[NewEvent],
        expected_version: int,
        rows: Sequence[Sequence[Any]],
    ) -> "AppendResult":
        """What an append of ``events`` stored, from the ``(transaction_id, position)`` rows
        its statement returned (one per event)."""
        positions = tuple(sorted(Position(int(r[0]), int(r[1])) for r in rows))
        return cls(
            stream_id,
            expected_version + len(events),
            tuple(str(e.event_id) for e in events),
            positions,
        )


class AppendStatements:
    """The four append statements: one event or many, to a new stream or an existing one.

    An append in a caller's transaction runs on the psycopg connection under the
    SQLAlchemy one (same connection, same transaction); one on its own, and the command
    bus's, run on libpq directly (:mod:`event_store.prepared`, arrays then as text): on the
    hot path even psycopg's Python layer costs more than the database. A single event is a plain
    ``INSERT … VALUES``; many go in one ``INSERT … SELECT FROM ROWS FROM (unnest(arrays),
    …)``, where ``data`` and ``metadata`` are each one JSON array (one ``json.dumps`` of
    the list, one parse in PostgreSQL), not arrays of JSON texts (a text array escapes
    every JSON string, element by element). Appending to an existing stream adds
    the guard that version ``expected`` exists and was written by an older transaction; a
    new stream needs no guard (``UNIQUE (stream_id, version)`` refuses a second version 1).
    """

    COLUMNS = (
        "event_id, stream_id, stream_type, version, event_type, schema_version, data, metadata,"
        " schema_id, payload"
    )

    def __init__(self, schema: str, arrays: str = "b") -> None:
        """``arrays``: ``"b"`` sends the arrays of a many-event append in binary (psycopg),
        ``"s"`` as text parameters (for :mod:`event_store.prepared`)."""
        table = f"{schema}.events"
        a = arrays
        guard = (
            f"WHERE EXISTS (SELECT 1 FROM {table} h WHERE h.stream_id = %(stream_id)s::text "
            "AND h.version = %(expected)s::integer "
            "AND h.transaction_id < pg_current_xact_id()::text::bigint)"
        )
        returning = "RETURNING transaction_id, position"
        one = (
            "%(event_id)s::uuid, %(stream_id)s::text, %(stream_type)s::text, "
            "%(version)s::integer, %(event_type)s::text, %(schema_version)s::integer, "
            "%(data)s::jsonb, %(metadata)s::jsonb, %(schema_id)s::integer, "
            "decode(%(payload)s::text, 'hex')"
        )
        # ``data`` and ``metadata`` are one JSON array each (one json.dumps, one jsonb
        # parse), zipped with the other arrays by ROWS FROM, element by element.
        many = f"""SELECT e.event_id, %(stream_id)s::text, %(stream_type)s::text,
                   %(expected)s::integer + e.ord::integer, e.event_type, e.schema_version,
                   e.data, e.metadata, e.schema_id, decode(e.payload, 'hex')
            FROM ROWS FROM (unnest(%(event_ids){a}::uuid[]), unnest(%(event_types){a}::text[]),
                            unnest(%(schema_versions){a}::integer[]),
                            jsonb_array_elements(%(data){a}::jsonb),
                            jsonb_array_elements(%(metadata){a}::jsonb),
                            unnest(%(schema_ids){a}::integer[]), unnest(%(payloads){a}::text[]))
                 WITH ORDINALITY
                 AS e(event_id, event_type, schema_version, data, metadata, schema_id, payload,
                      ord)"""
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
                schema_id=event.schema_id,
                payload=_hex(event.payload_head),
            )
            return params, self.one_guarded if expected else self.one_new
        params.update(
            event_ids=[e.event_id for e in events],
            event_types=[e.event_type for e in events],
            schema_versions=[e.schema_version for e in events],
            data=json.dumps([e.data for e in events]),
            metadata=json.dumps([e.metadata for e in events]),
            schema_ids=[e.schema_id for e in events],
            payloads=[_hex(e.payload_head) for e in events],
        )
        return params, self.many_guarded if expected else self.many_new


def _hex(head: bytes | None) -> str | None:
    """The payload's head as hex text (the same parameter in the binary and text forms; the
    statement decodes it; the store's trigger appends ``_meta``)."""
    return None if head is None else head.hex()


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
        self._text_sql = AppendStatements(self.tables.schema, arrays="s")
        self._queries = EventQueries(self.tables.schema)

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
        if connection is None:
            rows = self._append_alone(stream_id, events, expected_version, stream_type)
        else:
            params, statement = self._sql.for_append(
                stream_id, stream_type, events, expected_version
            )
            with self._driver(connection) as driver:
                try:
                    with driver.cursor() as cursor:
                        cursor.execute(statement, params)
                        rows = cursor.fetchall()
                except psycopg.Error as exc:
                    raise self.append_error(exc, stream_id, expected_version) from exc
        if not rows:
            actual = None if connection is not None else self.stream_version(stream_id)
            raise ConcurrencyError(stream_id, expected_version, actual)
        return self.append_result(stream_id, events, expected_version, rows)

    def _append_alone(
        self, stream_id: str, events: Sequence[NewEvent], expected: int, stream_type: str
    ) -> list[tuple[int, int]]:
        """An append outside a transaction: one prepared statement on libpq directly (see
        :mod:`event_store.prepared`), which PostgreSQL commits on its own; no BEGIN, no
        autocommit switch, no psycopg cursor."""
        params, sql = self._text_sql.for_append(stream_id, stream_type, events, expected)
        statement = Statement.of(sql)
        raw = self.engine.raw_connection()
        try:
            driver = raw.driver_connection
            if not isinstance(driver, psycopg.Connection):
                raise EventStoreError("the event store needs the psycopg 3 driver")
            for attempt in (1, 2):
                try:
                    [result] = prepared.run(driver, (statement, params))
                    break
                except StatementsLost:  # nothing ran: prepare again, once
                    if attempt == 2:
                        raise
                except psycopg.Error as exc:
                    if driver.pgconn.status != psycopg.pq.ConnStatus.OK:
                        raw.invalidate()
                    raise self.append_error(exc, stream_id, expected) from exc
        finally:
            raw.close()
        return [(int8(tx), int8(seq)) for tx, seq in prepared.rows(result)]

    def append_statement(
        self, stream_id: str, events: Sequence[NewEvent], expected_version: int, stream_type: str
    ) -> tuple[str, dict[str, Any]]:
        """The statement and parameters :meth:`append` runs (for a caller that pipelines it
        with other statements: the command bus). It returns ``(transaction_id, position)``
        per event, or no row when the stream is not at ``expected_version``."""
        params, statement = self._sql.for_append(stream_id, stream_type, events, expected_version)
        return statement, params

    def append_result(
        self,
        stream_id: str,
        events: Sequence[NewEvent],
        expected_version: int,
        rows: Sequence[Sequence[Any]],
    ) -> AppendResult:
        """What an :meth:`append_statement` stored, from the rows it returned."""
        if not rows:
            raise ConcurrencyError(stream_id, expected_version, None)
        return AppendResult.of(stream_id, events, expected_version, rows)

    def append_error(
        self, exc: psycopg.Error, stream_id: str, expected_version: int
    ) -> EventStoreError:
        """The store's error for a driver error of an append."""
        if isinstance(exc, psycopg.errors.UniqueViolation):
            if exc.diag.constraint_name == "events_stream_version_key":
                return ConcurrencyError(stream_id, expected_version, None)
        elif isinstance(exc, psycopg.errors.UndefinedTable):
            return SchemaMissingError(
                f"{self.tables.schema}.events does not exist: create it with "
                "event_store.create_schema (`tributary run-commands` does)",
                exc.sqlstate,
            )
        return StorageError(f"append to {stream_id!r} failed: {exc}", exc.sqlstate)

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
        params = stream_params(stream_id, from_version, to_version)
        with self._reading(connection) as driver:
            events = fetch_events(driver, self._queries.read_stream, params)
        return upcast_all(events, self.upcasters)

    def read_all(
        self,
        after: Position | None = None,
        limit: int = 1000,
        connection: Connection | None = None,
    ) -> list[RecordedEvent]:
        """Up to ``limit`` committed events after ``after``, in global order, upcast.

        Resume with the last event's ``position``; see the module docstring for why this
        never skips an event that commits later. One statement, streamed in chunks; each
        event keeps its id, JSON and position encoded until first used (``RecordedEvent``).
        """
        params = page_params(after, limit)
        with self._reading(connection) as driver:
            events = read_page(driver, self._queries.read_all, params, page_rows(JsonPage()))
        return upcast_all(events, self.upcasters)

    def iter_all(
        self,
        after: Position | None = None,
        page_size: int = 10_000,
        connection: Connection | None = None,
    ) -> Iterator[RecordedEvent]:
        """Every committed event after ``after``, in global order, page by page until a
        page comes back short (the reader has caught up with the horizon).

        Each page is a statement of its own: no transaction stays open while the consumer
        works, and events that commit meanwhile come in later pages, never skipped.
        """
        while True:
            page = self.read_all(after, page_size, connection)
            yield from page
            if len(page) < page_size:
                return
            after = page[-1].position

    def read_batches(
        self,
        columns: Sequence[str] = ("event_id", "stream_id", "event_type", "data"),
        after: Position | None = None,
        batch_size: int = 10_000,
        connection: Connection | None = None,
    ) -> "Iterator[pa.RecordBatch]":
        """The log after ``after`` as Arrow record batches, no Python object per event.

        Each batch holds ``columns`` (any of ``reading.BULK_COLUMNS``; JSON as UTF-8 text,
        ``recorded_at`` as UTC microseconds), then ``transaction_id`` and ``position``
        (int64): the last row's pair is the :class:`Position` to resume after. Same order,
        horizon and never-skip guarantee as :meth:`read_all`, one statement per batch, until
        a batch comes back short. Events whose type has an upcaster are upcast (only they
        are decoded).
        """
        names = check_columns(columns)
        selected = selected_columns(names, self.upcasters)
        statement = self._queries.bulk(selected)
        while True:
            with self._reading(connection) as driver:
                rows = read_page(driver, statement, page_params(after, batch_size), tuple)
            if rows:
                yield arrow_batch(rows, selected, names, self.upcasters)
            if len(rows) < batch_size:
                return
            after = last_position(rows)

    @contextmanager
    def _reading(self, connection: Connection | None) -> Iterator[psycopg.Connection[Any]]:
        """A driver connection for a read, with PostgreSQL's errors as the store's."""
        try:
            with self._driver(connection) as driver:
                yield driver
        except psycopg.errors.UndefinedTable as exc:
            raise SchemaMissingError(
                f"{self.tables.schema}.events does not exist: create it with "
                "event_store.create_schema (`tributary run-commands` does)",
                exc.sqlstate,
            ) from exc
        except psycopg.Error as exc:
            raise StorageError(
                f"reading {self.tables.schema}.events failed: {exc}", exc.sqlstate
            ) from exc
