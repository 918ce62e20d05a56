"""The command bus: load, decide, append — once per command id.

``send`` runs, in ONE transaction: look up the command id (a repeat returns the first
result and appends nothing), load the aggregate (snapshot + later events), run the
handler, append its events with the loaded version as the expected version, take a
snapshot when one is due, and record the command id with its result. A
:class:`ConcurrencyError` rolls everything back and the command is retried with a fresh
load, at most ``max_retries`` times; after that the error reaches the caller (nothing was
stored). A rejection is recorded too, so a repeat gets the same answer.
"""

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy import Connection, select

from event_store.aggregate import Aggregate
from event_store.command import Accepted, Command, CommandResult, Rejected, result_from_json
from event_store.errors import CommandRejected, ConcurrencyError, EventStoreError, StorageError
from event_store.event import RecordedEvent
from event_store.registry import CommandRegistry, HandlerContext, Route
from event_store.snapshots import SnapshotPolicy, SnapshotStore
from event_store.store import EventStore

Clock = Callable[[], datetime]


class _CommandStatements:
    """The bus's hot statements, run on the psycopg connection (see ``AppendStatements``)."""

    def __init__(self, schema: str) -> None:
        self.load = f"""
            WITH snap AS (
                SELECT version, state FROM {schema}.snapshots
                WHERE stream_id = %(stream_id)s AND snapshot_version = %(snapshot_version)s)
            SELECT (SELECT result FROM {schema}.commands WHERE command_id = %(command_id)s),
                   (SELECT jsonb_build_array(version, state) FROM snap),
                   e.event_id, e.stream_type, e.version, e.event_type, e.schema_version,
                   e.data, e.metadata, e.recorded_at, e.transaction_id, e.position
            FROM (SELECT 1) AS one
            LEFT JOIN {schema}.events e
                   ON e.stream_id = %(stream_id)s
                  AND e.version > COALESCE((SELECT version FROM snap), 0)
            ORDER BY e.version"""
        self.record = f"""
            INSERT INTO {schema}.commands (command_id, command_type, stream_id, result)
            VALUES (%(command_id)s, %(command_type)s, %(stream_id)s, %(result)s::jsonb)
            ON CONFLICT (command_id) DO NOTHING
            RETURNING command_id"""


def _driver_rows(conn: Connection, statement: str, params: dict[str, Any]) -> list[Any]:
    driver = conn.connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        raise EventStoreError("the event store needs the psycopg 3 driver")
    try:
        with driver.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchall()
    except psycopg.Error as exc:
        raise StorageError(f"command bus statement failed: {exc}", exc.sqlstate) from exc


class _RecordedByTwin(Exception):
    """A concurrent send of the same command id recorded its result first."""


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
    ) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.store = store
        self.registry = registry
        self.policy = snapshots or SnapshotPolicy()
        self.snapshots = SnapshotStore(store.tables)
        self.max_retries = max_retries
        self.clock = clock
        self.attempts = 0  # appends tried, retries included (for tests and benchmarks)
        self._sql = _CommandStatements(store.tables.schema)

    def send(self, command: Command, command_id: str | None = None) -> CommandResult:
        """Handle ``command``; the same ``command_id`` again returns the first result."""
        command_id = command_id or str(uuid.uuid4())
        route = self.registry.route(command)
        for attempt in range(self.max_retries + 1):
            try:
                return self._attempt(command, command_id, route)
            except ConcurrencyError:
                if attempt == self.max_retries:
                    raise
        raise AssertionError("unreachable")

    def previous_result(self, command_id: str) -> CommandResult | None:
        """The stored result of a command id, if it was handled before."""
        with self.store.engine.connect() as conn:
            return self._previous(conn, command_id)

    def load(
        self, aggregate_type: type[Aggregate[Any]], stream_id: str, conn: Connection | None = None
    ) -> Aggregate[Any]:
        """The aggregate from its latest usable snapshot plus the events after it.

        The same query ``send`` uses: a snapshot taken with another ``snapshot_version`` is
        ignored and the stream replayed from its first event.
        """
        if conn is None:
            with self.store.engine.connect() as own:
                return self.load(aggregate_type, stream_id, own)
        return self._previous_and_load(conn, None, aggregate_type, stream_id)[1]

    def replay(self, aggregate_type: type[Aggregate[Any]], stream_id: str) -> Aggregate[Any]:
        """The aggregate folded from every event of its stream, ignoring snapshots."""
        aggregate = aggregate_type(stream_id)
        events = self.store.read_stream(stream_id)
        aggregate.replay(self.registry.codec.decode(e) for e in events)
        return aggregate

    # -- one attempt -------------------------------------------------------------------

    def _attempt(self, command: Command, command_id: str, route: Route[Any, Any]) -> CommandResult:
        try:
            return self._transaction(command, command_id, route)
        except _RecordedByTwin:
            previous = self.previous_result(command_id)
            if previous is None:
                raise AssertionError(f"command {command_id} was recorded, then vanished") from None
            return previous

    def _transaction(
        self, command: Command, command_id: str, route: Route[Any, Any]
    ) -> CommandResult:
        stream_id = route.stream_id(command)
        with self.store.engine.begin() as conn:
            previous, aggregate = self._previous_and_load(
                conn, command_id, route.aggregate_type, stream_id
            )
            if previous is not None:
                return previous
            loaded_version = aggregate.version
            context = HandlerContext(command_id, self.clock(), conn)
            try:
                route.handle(aggregate, command, context)
            except CommandRejected as rejection:
                result: CommandResult = Rejected(command_id, rejection.reason)
            else:
                result = self._append(conn, command, command_id, aggregate, loaded_version)
            if not self._record(conn, command, command_id, stream_id, result):
                raise _RecordedByTwin  # leaves the block: our events roll back
            return result

    def _append(
        self,
        conn: Connection,
        command: Command,
        command_id: str,
        aggregate: Aggregate[Any],
        loaded_version: int,
    ) -> Accepted:
        metadata = {"command_id": command_id, "command_type": command.command_name}
        new_events = [self.registry.codec.encode(e, metadata) for e in aggregate.pending]
        self.attempts += 1
        appended = self.store.append(
            aggregate.stream_id,
            new_events,
            loaded_version,
            stream_type=aggregate.stream_type,
            connection=conn,
        )
        if self.policy.due(loaded_version, appended.version):
            self.snapshots.save(conn, aggregate, appended.version)
        return Accepted(
            command_id=command_id,
            stream_id=aggregate.stream_id,
            stream_type=aggregate.stream_type,
            version=appended.version,
            event_ids=appended.event_ids,
            position=appended.position,
        )

    def _record(
        self,
        conn: Connection,
        command: Command,
        command_id: str,
        stream_id: str,
        result: CommandResult,
    ) -> bool:
        """Record the command id and result; False when a concurrent twin recorded it first."""
        params = {
            "command_id": command_id,
            "command_type": command.command_name,
            "stream_id": stream_id,
            "result": json.dumps(result.to_json()),
        }
        return bool(_driver_rows(conn, self._sql.record, params))

    def _previous_and_load(
        self,
        conn: Connection,
        command_id: str | None,
        aggregate_type: type[Aggregate[Any]],
        stream_id: str,
    ) -> tuple[CommandResult | None, Aggregate[Any]]:
        """The command's earlier result and the loaded aggregate, in ONE round trip."""
        params = {
            "command_id": command_id,
            "stream_id": stream_id,
            "snapshot_version": aggregate_type.snapshot_version,
        }
        rows = _driver_rows(conn, self._sql.load, params)
        previous_json, snapshot = rows[0][0], rows[0][1]
        if previous_json is not None:
            return result_from_json(previous_json), aggregate_type(stream_id)
        if snapshot is None:
            aggregate = aggregate_type(stream_id)
        else:
            aggregate = aggregate_type.from_snapshot(stream_id, snapshot[0], snapshot[1])
        upcasters = self.store.upcasters
        events = []
        for row in rows:
            if row[2] is None:  # the stream has no events after the snapshot
                continue
            recorded = RecordedEvent.from_columns((row[2], stream_id, *row[3:12]))
            events.append(recorded if upcasters is None else upcasters.upcast(recorded))
        aggregate.replay(self.registry.codec.decode(e) for e in events)
        return None, aggregate

    def _previous(self, conn: Connection, command_id: str) -> CommandResult | None:
        t = self.store.tables.commands
        row = conn.execute(select(t.c.result).where(t.c.command_id == command_id)).first()
        return None if row is None else result_from_json(row[0])
