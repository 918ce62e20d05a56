"""The command bus: load, decide, append — once per command id.

``send`` runs, in ONE transaction: look up the command id (a repeat returns the first
result and appends nothing), load the aggregate (snapshot + later events), run the
handler, append its events with the loaded version as the expected version, take a
snapshot when one is due, and record the command id with its result. A
:class:`ConcurrencyError` rolls everything back and the command is retried with a fresh
load, at most ``max_retries`` times; after that the error reaches the caller (nothing was
stored). A rejection is recorded too, so a repeat gets the same answer.
"""

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, func, select
from sqlalchemy.dialects.postgresql import insert

from event_store.aggregate import Aggregate
from event_store.command import Accepted, Command, CommandResult, Rejected, result_from_json
from event_store.errors import CommandRejected, ConcurrencyError
from event_store.registry import CommandRegistry, HandlerContext, Route
from event_store.snapshots import Snapshot, SnapshotPolicy, SnapshotStore
from event_store.store import EventStore

Clock = Callable[[], datetime]


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
        """The aggregate from its latest usable snapshot plus the events after it."""
        if conn is None:
            with self.store.engine.connect() as own:
                return self.load(aggregate_type, stream_id, own)
        return self._load(conn, aggregate_type, stream_id, self.snapshots.load(conn, stream_id))

    def _load(
        self,
        conn: Connection,
        aggregate_type: type[Aggregate[Any]],
        stream_id: str,
        snapshot: Snapshot | None,
    ) -> Aggregate[Any]:
        aggregate = aggregate_type(stream_id)
        if snapshot is not None and snapshot.snapshot_version == aggregate_type.snapshot_version:
            aggregate = aggregate_type.from_snapshot(stream_id, snapshot.version, snapshot.state)
        later = self.store.read_stream(stream_id, aggregate.version + 1, connection=conn)
        aggregate.replay(self.registry.codec.decode(e) for e in later)
        return aggregate

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
            previous, snapshot = self._previous_and_snapshot(conn, command_id, stream_id)
            if previous is not None:
                return previous
            aggregate = self._load(conn, route.aggregate_type, stream_id, snapshot)
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
        t = self.store.tables.commands
        statement = (
            insert(t)
            .values(
                command_id=command_id,
                command_type=command.command_name,
                stream_id=stream_id,
                result=result.to_json(),
                recorded_at=func.now(),
            )
            .on_conflict_do_nothing(index_elements=[t.c.command_id])
            .returning(t.c.command_id)
        )
        return conn.execute(statement).first() is not None

    def _previous_and_snapshot(
        self, conn: Connection, command_id: str, stream_id: str
    ) -> tuple[CommandResult | None, Snapshot | None]:
        """The command's earlier result and the stream's snapshot, in one round trip."""
        c, s = self.store.tables.commands, self.snapshots.table
        snapshot_row = func.jsonb_build_array(
            s.c.stream_type, s.c.version, s.c.snapshot_version, s.c.state
        )
        row = conn.execute(
            select(
                select(c.c.result).where(c.c.command_id == command_id).scalar_subquery(),
                select(snapshot_row).where(s.c.stream_id == stream_id).scalar_subquery(),
            )
        ).one()
        previous = None if row[0] is None else result_from_json(row[0])
        if row[1] is None:
            return previous, None
        stream_type, version, snapshot_version, state = row[1]
        return previous, Snapshot(stream_id, stream_type, version, snapshot_version, state)

    def _previous(self, conn: Connection, command_id: str) -> CommandResult | None:
        t = self.store.tables.commands
        row = conn.execute(select(t.c.result).where(t.c.command_id == command_id)).first()
        return None if row is None else result_from_json(row[0])
