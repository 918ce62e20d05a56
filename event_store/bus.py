"""The command bus: load, decide, append — once per command id.

``send`` runs, in ONE transaction: look up the command id (a repeat returns the first
result and appends nothing), load the aggregate (snapshot + later events), run the
handler, append its events with the loaded version as the expected version, take a
snapshot when one is due, and record the command id with its result. A
:class:`ConcurrencyError` rolls everything back and the command is retried with a fresh
load, at most ``max_retries`` times; after that the error reaches the caller (nothing was
stored). A rejection is recorded too, so a repeat gets the same answer.

**Faults.** Any other exception caused by the command's content — a handler raising
something other than :class:`CommandRejected` (a ``ZeroDivisionError``), PostgreSQL refusing
its data (SQLSTATE class 22, 23 or 54: a NUL character in ``jsonb``, a number out of range)
— rolls the transaction back and becomes the command's :class:`Rejected` result naming the
cause, recorded like any rejection (:mod:`event_store.faults` draws the line). Failures of
the infrastructure (the database cannot be reached, a lost connection) still raise: the
command was not handled.

**Round trips.** The transaction costs two: ``BEGIN`` goes in one pipeline with the load
and the reads the route declares (:class:`~event_store.registry.Read`), and the writes go
in one pipeline with ``COMMIT`` (a handler's own ``query_one`` adds one each). A personal
field's key costs one more the first time the bus meets its subject; after that the key
comes from the bus's cache, and the write pipeline checks it is still the subject's
(:func:`~event_store.personal.key_guard_sql`: a forget since fails it, and the command runs
again and is rejected).
That is safe because every write of an accepted command is one statement built around
the append (the command record and the snapshot are written from the append's rows): when
the append's guard finds the stream moved (no row, no error) nothing is written, the
``COMMIT`` commits nothing and the command is retried. Errors (a unique violation: a
concurrent append, or a twin that recorded the same command id) abort the pipeline
before its ``COMMIT``, and the transaction is rolled back. These statements run on libpq
directly (:mod:`event_store.prepared`): psycopg's Python layer would cost more client CPU
than the database spends on them.

**State cache.** A stream's state at a version is a pure function of its events, which
never change: the bus keeps the state each load produced (per aggregate type and stream,
least recently used first out) and the next command on that stream loads only the events
after it, like a snapshot that needs no table. Aggregate states must therefore be
immutable (the frozen dataclasses :class:`~event_store.aggregate.Aggregate` asks for).
"""

import json
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import IsolationLevel
from psycopg.pq import TransactionStatus
from sqlalchemy import Connection, select

from connectors.partition_owners import FENCED_SQLSTATE
from event_store import prepared
from event_store.aggregate import Aggregate
from event_store.command import Accepted, Command, CommandResult, Rejected, result_from_json
from event_store.errors import (
    CommandRejected,
    ConcurrencyError,
    EventStoreError,
    FencedError,
    StorageError,
)
from event_store.event import NewEvent
from event_store.faults import brief, command_fault, storable_text, traceback_of
from event_store.lru import Lru
from event_store.personal import (
    KEYS_PRIMARY_KEY,
    KeyCache,
    PersonalDataRejected,
    PgKeys,
    Subject,
    key_guard_sql,
)
from event_store.prepared import Statement, StatementsLost, int8
from event_store.reading import event_from_row
from event_store.registry import CommandRegistry, HandlerContext, Read, Route
from event_store.snapshots import SnapshotPolicy, SnapshotStore
from event_store.store import AppendStatements, EventStore

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]

#: A fencing check run in the transaction of every write of a command, before the write: a
#: statement with ``%(name)s`` parameters and their values. It raises SQLSTATE ``TRF01``
#: when the writer no longer owns what it writes for (``connectors.partition_owners``);
#: the write is then refused with :class:`~event_store.errors.FencedError`.
Fence = tuple[str, Mapping[str, Any]]


def _fence_step(fence: Fence | None) -> list[prepared.Step]:
    return [] if fence is None else [(Statement.of(fence[0]), fence[1])]


def _fenced(exc: psycopg.Error, command_id: str) -> FencedError | None:
    if exc.sqlstate != FENCED_SQLSTATE:
        return None
    return FencedError(f"command {brief(command_id)} not stored: {exc}", exc.sqlstate)


UNSTORABLE_ID = (
    "the database cannot store this command: its command_id holds a NUL character or a lone "
    "surrogate, which PostgreSQL text cannot hold; send it with another command_id"
)

_EVENT_COLUMNS = (
    "e.event_id, e.stream_type, e.version, e.event_type, e.schema_version, e.data::text, "
    "e.metadata::text, e.recorded_at, e.transaction_id, e.position"
)


class _CommandStatements:
    """The bus's statements (``%(name)s`` parameters; see :mod:`event_store.prepared`)."""

    def __init__(self, schema: str) -> None:
        self.appends = AppendStatements(schema, arrays="s")
        self.key_guard = Statement.of(key_guard_sql(schema))
        previous = f"(SELECT result FROM {schema}.commands WHERE command_id = %(command_id)s::text)"
        # One statement, so the snapshot and the events after it come from one snapshot of
        # the database (two statements could see a newer snapshot and older events).
        self.load = f"""
            WITH snap AS (
                SELECT version, state FROM {schema}.snapshots
                WHERE stream_id = %(stream_id)s::text
                  AND snapshot_version = %(snapshot_version)s::integer)
            SELECT {previous}, (SELECT jsonb_build_array(version, state) FROM snap),
                   {_EVENT_COLUMNS}
            FROM (SELECT 1) AS one
            LEFT JOIN {schema}.events e
                   ON e.stream_id = %(stream_id)s::text
                  AND e.version > COALESCE((SELECT version FROM snap), 0)
            ORDER BY e.version"""
        # The same from a cached state at version %(after)s: no snapshot needed.
        self.load_after = f"""
            SELECT {previous}, NULL::jsonb, {_EVENT_COLUMNS}
            FROM (SELECT 1) AS one
            LEFT JOIN {schema}.events e
                   ON e.stream_id = %(stream_id)s::text AND e.version > %(after)s::integer
            ORDER BY e.version"""
        columns = "command_id, command_type, stream_id, result"
        # A plain INSERT: a twin that recorded the command id first makes it fail (and the
        # pipeline's COMMIT with it).
        self.record = f"""
            INSERT INTO {schema}.commands ({columns})
            VALUES (%(command_id)s::text, %(command_type)s::text, %(stream_id)s::text,
                    %(result)s::jsonb)"""
        # After an append (the CTE ``appended``, its RETURNING rows): the record, with the
        # last event's position, and the snapshot are written only if it stored events.
        self.record_appended = f"""
            INSERT INTO {schema}.commands ({columns})
            SELECT %(command_id)s::text, %(command_type)s::text, %(stream_id)s::text,
                   jsonb_set(%(result)s::jsonb, '{{position}}',
                             to_jsonb(max(transaction_id)::text || '.' || max(position)::text))
            FROM appended HAVING count(*) > 0"""
        self.snapshot_appended = f"""
            INSERT INTO {schema}.snapshots (stream_id, stream_type, version, snapshot_version,
                                            state)
            SELECT %(stream_id)s::text, %(stream_type)s::text, %(snapshot_at)s::integer,
                   %(snapshot_version)s::integer, %(state)s::jsonb
            WHERE EXISTS (SELECT 1 FROM appended)
            ON CONFLICT (stream_id) DO UPDATE
               SET version = excluded.version, snapshot_version = excluded.snapshot_version,
                   state = excluded.state, taken_at = excluded.taken_at
             WHERE {schema}.snapshots.version < excluded.version"""

    def write(self, append: str, snapshot: bool) -> Statement:
        """One statement for every write of an accepted command: the append, the command
        record and (when due) the snapshot; it returns the append's rows."""
        ctes = [f"appended AS ({append})", f"recorded AS ({self.record_appended})"]
        if snapshot:
            ctes.append(f"snapshot AS ({self.snapshot_appended})")
        return Statement.of(f"WITH {', '.join(ctes)} SELECT transaction_id, position FROM appended")


def _driver_of(conn: Connection) -> psycopg.Connection[Any]:
    driver = conn.connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        raise EventStoreError("the event store needs the psycopg 3 driver")
    return driver


def _event_values(row: list[bytes | None], stream_id: str) -> tuple[Any, ...]:
    """A load row's event columns (binary) as ``reading.event_from_row`` takes them."""
    event_id, stream_type, version, event_type, schema_version, data, metadata = row[2:9]
    recorded_at, transaction_id, position = row[9:12]
    assert stream_type is not None and event_type is not None
    assert data is not None and metadata is not None
    return (
        event_id,
        stream_id,
        stream_type.decode(),
        int8(version),
        event_type.decode(),
        int8(schema_version),
        data.decode(),
        metadata.decode(),
        int8(recorded_at),
        int8(transaction_id),
        int8(position),
    )


class _RecordedByTwin(Exception):
    """A concurrent send of the same command id recorded its result first."""


class StaleKeysError(StorageError):
    """Keys the bus had cached are no longer the subjects' keys (a subject was forgotten,
    or its key was created by a transaction that lost a race): nothing was written; the
    bus drops them and runs the command again."""

    def __init__(self, subjects: Sequence[Subject]) -> None:
        super().__init__(f"stale keys of {len(subjects)} subject(s): nothing written, run again")
        self.subjects = tuple(subjects)


class StateCache:
    """Aggregate states by (aggregate type, stream id) at a version, least recently used
    dropped first; an older version never replaces a newer one. Thread-safe."""

    def __init__(self, size: int) -> None:
        self._states: Lru[tuple[type[Any], str], tuple[int, Any]] = Lru(size)

    def get(self, aggregate_type: type[Any], stream_id: str) -> tuple[int, Any] | None:
        return self._states.get((aggregate_type, stream_id))

    def put(self, aggregate_type: type[Any], stream_id: str, version: int, state: Any) -> None:
        self._states.put(
            (aggregate_type, stream_id), (version, state), replaces=lambda old: old[0] < version
        )

    def __len__(self) -> int:
        return len(self._states)


def utc_now() -> datetime:
    return datetime.now(UTC)


class CommandBus:
    """Sends commands to their aggregates through the event store."""

    def __init__(
        self,
        store: EventStore,
        registry: CommandRegistry,
        snapshots: SnapshotPolicy | None = None,
        max_retries: int = 5,
        clock: Clock = utc_now,
        cache_size: int = 10_000,
    ) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.store = store
        self.registry = registry
        self.policy = snapshots or SnapshotPolicy()
        self.snapshots = SnapshotStore(store.tables)
        self.max_retries = max_retries
        self.clock = clock
        self.states = StateCache(cache_size)
        # The subjects' keys found so far: a cached key costs no round trip; the write
        # checks it in its own pipeline (event_store.personal.key_guard_sql).
        self.keys = KeyCache(cache_size)
        self.attempts = 0  # appends tried, retries included (for tests and benchmarks)
        self.conflicts = 0  # optimistic-concurrency conflicts met (each retried or given up)
        self._sql = _CommandStatements(store.tables.schema)

    def send(
        self, command: Command, command_id: str | None = None, fence: Fence | None = None
    ) -> CommandResult:
        """Handle ``command``; the same ``command_id`` again returns the first result.

        An exception the command caused (see :mod:`event_store.faults`) is answered and
        recorded as its rejection; infrastructure failures raise, and so does a
        :class:`ConcurrencyError` that outlasted ``max_retries``. ``fence`` (see
        :data:`Fence`) runs in the transaction of each of the command's writes; when it
        refuses, nothing is stored and :class:`FencedError` is raised.
        """
        command_id = command_id or str(uuid.uuid4())
        route = self.registry.route(command)
        if storable_text(command_id) != command_id:
            return self._reject(command, command_id, route, UNSTORABLE_ID, fence)
        for attempt in range(self.max_retries + 1):
            try:
                return self._attempt(command, command_id, route, fence)
            except (ConcurrencyError, StatementsLost, StaleKeysError) as exc:
                if isinstance(exc, ConcurrencyError):
                    self.conflicts += 1
                if isinstance(exc, StaleKeysError):
                    self.keys.drop(exc.subjects)
                if attempt == self.max_retries:
                    raise
            except Exception as exc:
                reason = command_fault(exc)
                if reason is None:
                    raise
                log.warning(
                    "command %s (%s) rejected: %s%s",
                    brief(command_id),
                    command.command_name,
                    reason,
                    traceback_of(exc),
                )
                return self._reject(command, command_id, route, reason, fence)
        raise AssertionError("unreachable")

    def previous_result(self, command_id: str) -> CommandResult | None:
        """The stored result of a command id, if it was handled before."""
        with self.store.engine.connect() as conn:
            return self._previous(conn, command_id)

    def load(
        self, aggregate_type: type[Aggregate[Any]], stream_id: str, conn: Connection | None = None
    ) -> Aggregate[Any]:
        """The aggregate from its latest usable snapshot plus the events after it.

        The same query ``send`` uses without a cached state: a snapshot taken with another
        ``snapshot_version`` is ignored and the stream replayed from its first event.
        """
        if conn is None:
            with self.store.engine.connect() as own:
                return self.load(aggregate_type, stream_id, own)
        params = self._load_params(None, aggregate_type, stream_id)
        try:
            [result] = prepared.run(_driver_of(conn), (Statement.of(self._sql.load), params))
        except psycopg.Error as exc:
            raise StorageError(f"loading {stream_id!r} failed: {exc}", exc.sqlstate) from exc
        return self._aggregate(prepared.rows(result), aggregate_type, stream_id, None)

    def replay(self, aggregate_type: type[Aggregate[Any]], stream_id: str) -> Aggregate[Any]:
        """The aggregate folded from every event of its stream, ignoring snapshots."""
        aggregate = aggregate_type(stream_id)
        events = self.store.read_stream(stream_id)
        aggregate.replay(self.registry.codec.decode(e) for e in events)
        return aggregate

    def _reject(
        self,
        command: Command,
        command_id: str,
        route: Route[Any, Any],
        reason: str,
        fence: Fence | None = None,
    ) -> CommandResult:
        """Record ``reason`` as the command's rejection and answer it (or the result a twin
        recorded first), in a statement of its own: the command's transaction, if it got
        that far, was rolled back, so nothing else of the command is stored.

        What is recorded is sanitized with :func:`~event_store.faults.storable_text`: the
        command id, its stream id and the reason may hold the very NUL character or lone
        surrogate that failed the command, and recording its rejection must not fail again.
        (The answer carries the sanitized reason too, so a repeat's answer is the same; its
        ``command_id`` is always the caller's.) Should the database still refuse the record
        for its data (a command id too large for the primary key's index), the rejection is
        answered unrecorded: the command fails the same way on every repeat, so a repeat
        still gets the same answer.
        """
        key = storable_text(command_id)
        result = Rejected(command_id, storable_text(reason))
        try:
            stream_id: str | None = storable_text(route.stream_id(command))
        except Exception:  # the stream id is what failed
            stream_id = None
        params = {
            "command_id": key,
            "command_type": command.command_name,
            "stream_id": stream_id,
            "result": json.dumps(replace(result, command_id=key).to_json()),
        }
        for attempt in (1, 2):
            try:
                with self._session() as (_, driver):
                    record = (Statement.of(self._sql.record), params)
                    if fence is None:
                        prepared.run(driver, record)
                    else:
                        steps = [(self._begin(driver), None), *_fence_step(fence), record]
                        prepared.run(driver, *steps, (b"COMMIT", None))
                return result
            except StatementsLost:
                if attempt == 2:
                    raise
            except psycopg.errors.UniqueViolation as exc:  # a twin recorded the id first
                previous = self.previous_result(key)
                if previous is None:
                    raise AssertionError(f"command {key} was recorded, then vanished") from exc
                return replace(previous, command_id=command_id)
            except psycopg.Error as exc:
                refused = _fenced(exc, key)
                if refused is not None:
                    raise refused from exc
                if command_fault(exc) is None:
                    raise StorageError(
                        f"recording command {brief(key)} failed: {exc}", exc.sqlstate
                    ) from exc
                log.warning(
                    "the rejection of command %s is not recorded: %s",
                    brief(key),
                    brief(str(exc), 500),
                )
                return result
        raise AssertionError("unreachable")

    # -- one attempt -------------------------------------------------------------------

    def _attempt(
        self, command: Command, command_id: str, route: Route[Any, Any], fence: Fence | None
    ) -> CommandResult:
        try:
            return self._transaction(command, command_id, route, fence)
        except _RecordedByTwin:
            previous = self.previous_result(command_id)
            if previous is None:
                raise AssertionError(f"command {command_id} was recorded, then vanished") from None
            return previous

    @contextmanager
    def _session(self) -> Iterator[tuple[Connection, psycopg.Connection[Any]]]:
        """A pooled connection for one command's transaction, which the bus opens and
        commits itself (``BEGIN`` and ``COMMIT`` share pipelines with its statements);
        handlers read through the SQLAlchemy connection, in the same transaction. Whatever
        is left open (an error, an early return) is rolled back before the connection goes
        back to the pool; a connection that fails at that is dropped from the pool."""
        with self.store.engine.connect() as conn:
            driver = _driver_of(conn)
            try:
                yield conn, driver
            finally:
                try:
                    if driver.pgconn.transaction_status != TransactionStatus.IDLE:
                        prepared.run(driver, (b"ROLLBACK", None))
                except (psycopg.Error, EventStoreError):
                    conn.invalidate()

    def _begin(self, driver: psycopg.Connection[Any]) -> bytes:
        """``BEGIN`` with the connection's isolation level and access mode, as psycopg
        would send it."""
        parts = [b"BEGIN"]
        if driver.isolation_level is not None:
            level = IsolationLevel(driver.isolation_level).name.replace("_", " ")
            parts.append(b"ISOLATION LEVEL " + level.encode())
        if driver.read_only is not None:
            parts.append(b"READ ONLY" if driver.read_only else b"READ WRITE")
        return b" ".join(parts)

    def _transaction(
        self, command: Command, command_id: str, route: Route[Any, Any], fence: Fence | None
    ) -> CommandResult:
        stream_id = route.stream_id(command)
        aggregate_type = route.aggregate_type
        with self._session() as (conn, driver):
            cached = self.states.get(aggregate_type, stream_id)
            reads = route.reads(command) if route.reads is not None else {}
            rows, found = self._begin_and_load(
                driver, command_id, aggregate_type, stream_id, cached, reads
            )
            if rows[0][0] is not None:
                prepared.run(driver, (b"COMMIT", None))  # it only read
                return result_from_json(json.loads(rows[0][0][1:]))
            aggregate = self._aggregate(rows, aggregate_type, stream_id, cached)
            loaded_version = aggregate.version
            if loaded_version:
                self.states.put(aggregate_type, stream_id, loaded_version, aggregate.state)
            context = HandlerContext(command_id, self.clock(), conn, found)
            try:
                route.handle(aggregate, command, context)
            except CommandRejected as rejection:
                result: CommandResult = Rejected(command_id, rejection.reason)
                self._commit(driver, command, command_id, stream_id, result, None, None, fence)
                return result
            try:
                return self._accept(driver, command, command_id, aggregate, loaded_version, fence)
            except PersonalDataRejected as forgotten:  # raised before anything is written
                result = Rejected(command_id, str(forgotten))
                self._commit(driver, command, command_id, stream_id, result, None, None, fence)
                return result

    def _begin_and_load(
        self,
        driver: psycopg.Connection[Any],
        command_id: str,
        aggregate_type: type[Aggregate[Any]],
        stream_id: str,
        cached: tuple[int, Any] | None,
        reads: Mapping[str, Read],
    ) -> tuple[list[list[bytes | None]], dict[str, tuple[Any, ...] | None]]:
        """BEGIN, the load and the route's reads in one round trip: the load's rows (the
        earlier result of the command id, the snapshot unless a cached state is newer,
        the events after it; binary) and each read's first row."""
        params = self._load_params(command_id, aggregate_type, stream_id)
        statement = Statement.of(self._sql.load)
        if cached is not None:
            params["after"] = cached[0]
            statement = Statement.of(self._sql.load_after)
        steps: list[prepared.Step] = [(self._begin(driver), None), (statement, params)]
        steps += [(Statement.of(read.sql), read.params) for read in reads.values()]
        try:
            results = prepared.run(driver, *steps)
        except psycopg.Error as exc:
            raise StorageError(f"loading {stream_id!r} failed: {exc}", exc.sqlstate) from exc
        found = {
            name: prepared.first_row(driver, result)
            for name, result in zip(reads, results[2:], strict=True)
        }
        return prepared.rows(results[1]), found

    def _load_params(
        self, command_id: str | None, aggregate_type: type[Aggregate[Any]], stream_id: str
    ) -> dict[str, Any]:
        return {
            "command_id": command_id,
            "stream_id": stream_id,
            "snapshot_version": aggregate_type.snapshot_version,
        }

    def _aggregate(
        self,
        rows: list[list[bytes | None]],
        aggregate_type: type[Aggregate[Any]],
        stream_id: str,
        cached: tuple[int, Any] | None,
    ) -> Aggregate[Any]:
        """The aggregate from a load's rows (binary values): the cached state, else the
        snapshot, else the initial state, then the events after it, upcast and decoded."""
        snapshot = rows[0][1]
        if cached is not None:
            aggregate = aggregate_type(stream_id, cached[1], cached[0])
        elif snapshot is not None:
            version, state = json.loads(snapshot[1:])  # jsonb: a version byte, then text
            aggregate = aggregate_type.from_snapshot(stream_id, version, state)
        else:
            aggregate = aggregate_type(stream_id)
        if rows[0][2] is not None:  # else the stream has no events after that
            upcasters = self.store.upcasters
            codec = self.registry.codec
            events = []
            for row in rows:
                recorded = event_from_row(_event_values(row, stream_id))
                if upcasters is not None:
                    recorded = upcasters.upcast(recorded)
                events.append(codec.decode(recorded))
            aggregate.replay(events)
        return aggregate

    def _accept(
        self,
        driver: psycopg.Connection[Any],
        command: Command,
        command_id: str,
        aggregate: Aggregate[Any],
        loaded_version: int,
        fence: Fence | None,
    ) -> Accepted:
        metadata = {"command_id": command_id, "command_type": command.command_name}
        keys = PgKeys(driver, self.store.tables.schema, self.keys)
        new_events = [self.registry.codec.encode(e, metadata, keys) for e in aggregate.pending]
        guards = [
            (self._sql.key_guard, {"t": subject[0], "i": subject[1], "k": key.hex()})
            for subject, key in keys.guards
        ]
        version = loaded_version + len(new_events)
        accepted = Accepted(
            command_id=command_id,
            stream_id=aggregate.stream_id,
            stream_type=aggregate.stream_type,
            version=version,
            event_ids=tuple(str(e.event_id) for e in new_events),
            position=None,  # known once appended: the record statement fills it in
        )
        if not new_events:
            self._commit(
                driver, command, command_id, aggregate.stream_id, accepted, None, None, fence
            )
            return accepted
        self.attempts += 1
        snapshot = None
        if self.policy.due(loaded_version, version):
            snapshot = {
                "snapshot_at": version,
                "snapshot_version": aggregate.snapshot_version,
                "state": json.dumps(aggregate.snapshot_state()),
            }
        rows = self._commit(
            driver,
            command,
            command_id,
            aggregate.stream_id,
            accepted,
            (new_events, loaded_version, aggregate.stream_type),
            snapshot,
            fence,
            guards,
        )
        appended = self.store.append_result(aggregate.stream_id, new_events, loaded_version, rows)
        return Accepted(
            command_id=command_id,
            stream_id=aggregate.stream_id,
            stream_type=aggregate.stream_type,
            version=appended.version,
            event_ids=appended.event_ids,
            position=appended.position,
        )

    def _commit(
        self,
        driver: psycopg.Connection[Any],
        command: Command,
        command_id: str,
        stream_id: str,
        result: CommandResult,
        append: tuple[Sequence[NewEvent], int, str] | None,
        snapshot: dict[str, Any] | None,
        fence: Fence | None = None,
        guards: Sequence[prepared.Step] = (),
    ) -> list[tuple[int, int]]:
        """The writes and COMMIT in one round trip; the append's ``(transaction_id,
        position)`` rows (none when its guard found the stream moved: then nothing was
        written, see the module docstring). ``guards``: the key guards of cached keys the
        events were encrypted with (:class:`StaleKeysError` when one fails)."""
        params = {
            "command_id": command_id,
            "command_type": command.command_name,
            "stream_id": stream_id,
            "result": json.dumps(result.to_json()),
        }
        statement = Statement.of(self._sql.record)
        expected = 0
        if append is not None:
            events, expected, stream_type = append
            append_params, append_sql = self._sql.appends.for_append(
                stream_id, stream_type, events, expected
            )
            statement = self._sql.write(append_sql, snapshot is not None)
            params |= append_params | (snapshot or {})
        checks = [*_fence_step(fence), *guards]
        try:
            results = prepared.run(driver, *checks, (statement, params), (b"COMMIT", None))
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name == "commands_pkey":
                raise _RecordedByTwin from exc
            if exc.diag.constraint_name == KEYS_PRIMARY_KEY and guards:
                raise StaleKeysError(
                    [(str(g[1]["t"]), str(g[1]["i"])) for g in guards if g[1] is not None]
                ) from exc
            raise self.store.append_error(exc, stream_id, expected) from exc
        except psycopg.Error as exc:
            refused = _fenced(exc, command_id)
            if refused is not None:
                raise refused from exc
            raise self.store.append_error(exc, stream_id, expected) from exc
        return [(int8(tx), int8(seq)) for tx, seq in prepared.rows(results[len(checks)])]

    def _previous(self, conn: Connection, command_id: str) -> CommandResult | None:
        t = self.store.tables.commands
        row = conn.execute(select(t.c.result).where(t.c.command_id == command_id)).first()
        return None if row is None else result_from_json(row[0])
