"""The library's recorders on Tributary's event store.

Every event goes into the store's ``events`` table (the CDC outbox) with its application's next
notification ids, in one statement (one round trip, its own transaction):

1. ``INSERT … ON CONFLICT DO UPDATE`` on the application's counter row takes ``n`` ids. The row
   stays locked until the statement commits, so the application's writers take ids one after
   the other *through their commit*: ids are committed in order, and a reader that has seen id
   ``k`` will never later find a smaller one (never skipping). A failed write rolls the counter
   back with it, so there are no gaps either. (The library's PostgreSQL recorder gets the same
   with ``LOCK TABLE``; here other applications and Tributary's own appends are not held up.)
2. ``INSERT INTO events … SELECT … FROM unnest(…)`` writes the rows; ``UNIQUE (stream_id,
   version)`` refuses a second event at a version (optimistic concurrency: the library's
   ``IntegrityError``). ``pg_notify`` wakes the application's subscriptions.

Reads go through the store's fast read path (:mod:`event_store.reading`: binary rows, C
loaders, large pages streamed in chunks); the stored state is rebuilt by PostgreSQL
(:data:`event_store.eventsourcing.tables.STATE`), so no JSON is parsed in Python.
"""

import base64
import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from threading import Thread
from typing import Any, cast
from uuid import UUID

import psycopg
from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    DataError,
    IntegrityError,
    InterfaceError,
    ListenNotifySubscription,
    Notification,
    OperationalError,
    ProcessRecorder,
    StoredEvent,
    Subscription,
    Tracking,
    TrackingRecorder,
)
from eventsourcing.postgres import PostgresDatastore
from eventsourcing.utils import retry
from psycopg import sql
from psycopg.rows import tuple_row

from event_store.eventsourcing.config import RecorderConfig
from event_store.eventsourcing.naming import MAX_ORIGINATOR_VERSION, event_naming, json_state
from event_store.eventsourcing.tables import (
    APPLICATION,
    NOTIFICATION_ID,
    OURS,
    STATE,
    TOPIC,
    create_tables,
)
from event_store.reading import fetch_rows

_new = object.__new__
_set = object.__setattr__

#: The library's PostgreSQL recorders retry reads this way after a lost connection.
_retry_reads = retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)


def _stored_event(fields: dict[str, Any]) -> StoredEvent:
    event: StoredEvent = _new(StoredEvent)
    _set(event, "__dict__", fields)  # what the frozen dataclass's __init__ does, at once
    return event


def _stored_events(rows: Sequence[Sequence[Any]]) -> list[StoredEvent]:
    """Stored events of rows ``(originator_id, originator_version, topic, state)``."""
    return [
        _stored_event(
            {
                "originator_id": originator,
                "originator_version": version,
                "topic": topic,
                "state": state,
            }
        )
        for originator, version, topic, state in rows
    ]


def _select_statement(
    select: str, where: list[str], version: str, gt: bool, lte: bool, desc: bool, limit: bool
) -> str:
    """``SELECT select WHERE where`` (and ``version`` above ``%(gt)s``, at most ``%(lte)s``
    when asked) in ``version`` order, at most ``%(limit)s`` rows when asked."""
    if gt:
        where.append(f"{version} > %(gt)s")
    if lte:
        where.append(f"{version} <= %(lte)s")
    return (
        f"SELECT {select} WHERE {' AND '.join(where)} "
        f"ORDER BY {version} {'DESC' if desc else 'ASC'}" + (" LIMIT %(limit)s" if limit else "")
    )


def _notification(fields: dict[str, Any]) -> Notification:
    notification: Notification = _new(Notification)
    _set(notification, "__dict__", fields)
    return notification


class TributaryRecorder:
    """Base of the recorders: the library's datastore (its pool, settings and error mapping)
    and this recorder's place in the store."""

    def __init__(self, datastore: PostgresDatastore, config: RecorderConfig) -> None:
        self.datastore = datastore
        self.config = config
        self.schema = config.schema

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection (autocommit) that gives rows as tuples; PostgreSQL's errors
        come out as the library's (``IntegrityError``, ``OperationalError``, …)."""
        with self.datastore.get_connection() as conn:
            conn.row_factory = cast(Any, tuple_row)
            yield cast(psycopg.Connection[Any], conn)

    def create_table(self) -> None:
        """The event store schema, if missing, and the module's tables (idempotent)."""
        create_tables(self.connection, self.schema)

    def stream_id(self, originator_id: UUID | str) -> str:
        """The store's stream id of an originator id (a UUID in its canonical text form)."""
        if self.config.originator_id_type == "text":
            return str(originator_id)
        if isinstance(originator_id, UUID):
            return str(originator_id)
        try:
            return str(UUID(originator_id))
        except (TypeError, ValueError, AttributeError):
            raise DataError(
                f"originator id {originator_id!r} is not a UUID; set ORIGINATOR_ID_TYPE=text "
                "for string ids"
            ) from None

    def originator_id_column(self) -> str:
        """How a read selects the stream id: as a uuid (loaded into a ``UUID``) or as text."""
        return "stream_id::uuid" if self.config.originator_id_type == "uuid" else "stream_id"


class _OutboxRecorder(TributaryRecorder):
    """Writes events into the outbox with notification ids, reads them back by stream."""

    def __init__(self, datastore: PostgresDatastore, config: RecorderConfig) -> None:
        super().__init__(datastore, config)
        s = self.schema
        digest = hashlib.sha1(f"{s}/{config.application}".encode()).hexdigest()[:20]
        self.channel_name = f"tributary_es_{digest}"
        self.insert_events_statement = f"""
            WITH counter AS (
                INSERT INTO {s}.es_notification_counters AS c (application, last_id)
                VALUES (%(application)s, %(count)s)
                ON CONFLICT (application) DO UPDATE SET last_id = c.last_id + %(count)s
                RETURNING c.last_id - %(count)s AS base
            )
            INSERT INTO {s}.events (event_id, stream_id, stream_type, version, event_type,
                                    schema_version, data, metadata)
            SELECT gen_random_uuid(), e.stream_id, e.stream_type, e.version, e.event_type,
                   e.schema_version, e.data,
                   jsonb_build_object('eventsourcing', jsonb_strip_nulls(jsonb_build_object(
                       'application', %(application)s::text,
                       'notification_id', counter.base + e.ord,
                       'topic', e.topic,
                       'state', e.state)))
            FROM counter,
                 (SELECT pg_notify(%(channel)s, '')) AS notified,
                 unnest(%(stream_ids)b::text[], %(stream_types)b::text[],
                        %(versions)b::integer[], %(event_types)b::text[],
                        %(schema_versions)b::integer[], %(data)b::jsonb[],
                        %(topics)b::text[], %(states)b::text[])
                 WITH ORDINALITY AS e(stream_id, stream_type, version, event_type,
                                      schema_version, data, topic, state, ord)
            RETURNING {NOTIFICATION_ID}"""
        self._select_events: dict[tuple[bool, bool, bool, bool], str] = {}

    # -- writing ---------------------------------------------------------------------------

    def event_params(self, stored_events: Sequence[StoredEvent]) -> dict[str, Any]:
        """The insert's parameters: one array per column."""
        application = self.config.application
        columns: dict[str, list[Any]] = {
            name: []
            for name in (
                "stream_ids",
                "stream_types",
                "versions",
                "event_types",
                "schema_versions",
                "data",
                "topics",
                "states",
            )
        }
        for event in stored_events:
            version = event.originator_version
            if not 0 <= version <= MAX_ORIGINATOR_VERSION:
                raise DataError(
                    f"originator_version {version} is outside what the event store keeps "
                    f"(0 to {MAX_ORIGINATOR_VERSION})"
                )
            naming = event_naming(event.topic, application)
            state = json_state(event.state)
            columns["stream_ids"].append(self.stream_id(event.originator_id))
            columns["stream_types"].append(naming.stream_type)
            columns["versions"].append(version + 1)
            columns["event_types"].append(naming.event_type)
            columns["topics"].append(event.topic)
            if state is None:
                columns["schema_versions"].append(1)
                columns["data"].append("{}")
                columns["states"].append(base64.b64encode(event.state).decode("ascii"))
            else:
                columns["schema_versions"].append(state.class_version)
                columns["data"].append(state.text)
                columns["states"].append(None)
        return {
            **columns,
            "application": application,
            "count": len(stored_events),
            "channel": self.channel_name,
        }

    def write_events(
        self, conn: psycopg.Connection[Any], stored_events: Sequence[StoredEvent]
    ) -> list[int]:
        """Insert the events on ``conn`` (in the caller's transaction, if any): their
        notification ids, in order."""
        params = self.event_params(stored_events)
        if not self.config.lock_timeout:
            rows = conn.execute(self.insert_events_statement, params).fetchall()
        else:  # the wait for the counter row is bounded, as the library bounds LOCK TABLE's
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{int(self.config.lock_timeout)}s'")
                rows = conn.execute(self.insert_events_statement, params).fetchall()
        return sorted(int(row[0]) for row in rows)

    def record(self, stored_events: Sequence[StoredEvent]) -> list[int]:
        """Insert the events in a statement of their own: their notification ids."""
        if not stored_events:
            return []
        with self.connection() as conn:
            return self.write_events(conn, stored_events)

    # -- reading ---------------------------------------------------------------------------

    def select_events_statement(self, gt: bool, lte: bool, desc: bool, limit: bool) -> str:
        key = (gt, lte, desc, limit)
        statement = self._select_events.get(key)
        if statement is None:
            # The application is checked on the stream's rows, in a form the notification
            # index cannot serve: the planner has no statistics for that partial index's
            # expressions and would otherwise scan the application's whole log for a stream.
            where = [
                "stream_id = %(stream_id)s",
                "metadata -> 'eventsourcing' ->> 'application' = %(application)s",
            ]
            statement = _select_statement(
                f"{self.originator_id_column()}, version - 1, {TOPIC}, {STATE} "
                f"FROM {self.schema}.events",
                where,
                "version",
                *key,
            )
            self._select_events[key] = statement
        return statement

    @_retry_reads
    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        """The originator's events (versions above ``gt``, up to ``lte``), in version order."""
        statement = self.select_events_statement(
            gt is not None, lte is not None, desc, limit is not None
        )
        params: dict[str, Any] = {
            "stream_id": self.stream_id(originator_id),
            "application": self.config.application,
        }
        if gt is not None:
            params["gt"] = gt + 1
        if lte is not None:
            params["lte"] = lte + 1
        if limit is not None:
            params["limit"] = limit
        with self.connection() as conn:
            rows = fetch_rows(conn, statement, params)
        return _stored_events(rows)


class TributaryAggregateRecorder(_OutboxRecorder, AggregateRecorder):
    """An aggregate recorder on the outbox: events are published like the application
    recorder's (they take notification ids too), ``insert_events`` returns None."""

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> None:
        self.record(stored_events)


class TributaryApplicationRecorder(_OutboxRecorder, ApplicationRecorder):
    """The application's notification log on the outbox: gap-free ids, never skipped."""

    def __init__(self, datastore: PostgresDatastore, config: RecorderConfig) -> None:
        super().__init__(datastore, config)
        self._select_notifications: dict[tuple[bool, bool, bool, bool], str] = {}
        self.max_notification_id_statement = (
            f"SELECT last_id FROM {self.schema}.es_notification_counters "
            "WHERE application = %(application)s"
        )

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """Record the events atomically: their notification ids (None for no events)."""
        return self.record(stored_events) or None

    def select_notifications_statement(
        self, start: bool, inclusive: bool, stop: bool, topics: bool
    ) -> str:
        key = (start, inclusive, stop, topics)
        statement = self._select_notifications.get(key)
        if statement is None:
            where = [OURS, f"{APPLICATION} = %(application)s"]
            if start:
                where.append(f"{NOTIFICATION_ID} {'>=' if inclusive else '>'} %(start)s")
            if stop:
                where.append(f"{NOTIFICATION_ID} <= %(stop)s")
            if topics:
                where.append(f"{TOPIC} = ANY(%(topics)s)")
            statement = (
                f"SELECT {NOTIFICATION_ID}, {self.originator_id_column()}, version - 1, "
                f"{TOPIC}, {STATE} FROM {self.schema}.events WHERE {' AND '.join(where)} "
                f"ORDER BY {NOTIFICATION_ID} LIMIT %(limit)s"
            )
            self._select_notifications[key] = statement
        return statement

    @_retry_reads
    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """Up to ``limit`` notifications from ``start`` (or after it), up to ``stop``, of the
        given topics (all when none), in notification id order."""
        statement = self.select_notifications_statement(
            start is not None, inclusive_of_start, stop is not None, bool(topics)
        )
        params: dict[str, Any] = {
            "application": self.config.application,
            "start": start,
            "stop": stop,
            "topics": list(topics),
            "limit": limit,
        }
        with self.connection() as conn:
            rows = fetch_rows(conn, statement, params)
        return [
            _notification(
                {
                    "originator_id": originator,
                    "originator_version": version,
                    "topic": topic,
                    "state": state,
                    "id": notification_id,
                }
            )
            for notification_id, originator, version, topic, state in rows
        ]

    @_retry_reads
    def max_notification_id(self) -> int | None:
        """The application's last committed notification id (None before its first event)."""
        with self.connection() as conn:
            row = conn.execute(
                self.max_notification_id_statement, {"application": self.config.application}
            ).fetchone()
        return None if row is None else int(row[0])

    def subscribe(
        self, gt: int | None = None, topics: Sequence[str] = ()
    ) -> Subscription[ApplicationRecorder]:
        """Notifications after ``gt`` as they are recorded (LISTEN/NOTIFY wakes the reader)."""
        return NotificationSubscription(recorder=self, gt=gt, topics=topics)


class NotificationSubscription(ListenNotifySubscription[TributaryApplicationRecorder]):
    """The library's pulling subscription, woken by the recorder's ``pg_notify``."""

    def __init__(
        self,
        recorder: TributaryApplicationRecorder,
        gt: int | None = None,
        topics: Sequence[str] = (),
    ) -> None:
        super().__init__(recorder=recorder, gt=gt, topics=topics)
        self._listen_thread = Thread(target=self._listen, daemon=True)
        self._listen_thread.start()

    def __exit__(self, *args: object, **kwargs: Any) -> None:
        try:
            super().__exit__(*args, **kwargs)
        finally:
            self._listen_thread.join()

    def _listen(self) -> None:
        try:
            with self._recorder.connection() as conn:
                conn.execute(
                    sql.SQL("LISTEN {}").format(sql.Identifier(self._recorder.channel_name))
                )
                # An event recorded between the first pull and the LISTEN sent no notice we
                # could hear: pull once more now that we listen.
                self._has_been_notified.set()
                while not self._has_been_stopped and not self._thread_error:
                    for _ in conn.notifies(timeout=0.1, stop_after=1):
                        self._has_been_notified.set()
                conn.execute("UNLISTEN *")
        except BaseException as exc:
            if self._thread_error is None:
                self._thread_error = exc
            self.stop()


class TributaryTrackingRecorder(TributaryRecorder, TrackingRecorder):
    """Tracking records (one row per upstream application, the library's "single-row"
    tracking) in ``es_tracking``, keyed by the recording application too."""

    def __init__(self, datastore: PostgresDatastore, config: RecorderConfig) -> None:
        super().__init__(datastore, config)
        s = self.schema
        self.insert_tracking_statement = (
            f"INSERT INTO {s}.es_tracking AS t (application, upstream, notification_id) "
            "VALUES (%(application)s, %(upstream)s, %(notification_id)s) "
            "ON CONFLICT (application, upstream) DO UPDATE "
            "SET notification_id = EXCLUDED.notification_id "
            "WHERE t.notification_id < EXCLUDED.notification_id RETURNING notification_id"
        )
        self.max_tracking_id_statement = (
            f"SELECT notification_id FROM {s}.es_tracking "
            "WHERE application = %(application)s AND upstream = %(upstream)s"
        )

    def tracking_params(self, tracking: Tracking) -> dict[str, Any]:
        return {
            "application": self.config.application,
            "upstream": tracking.application_name,
            "notification_id": tracking.notification_id,
        }

    def insert_tracking(self, tracking: Tracking) -> None:
        """Record that ``tracking``'s notification was processed; one at or below the last
        recorded one raises ``IntegrityError``."""
        with self.connection() as conn:
            row = conn.execute(
                self.insert_tracking_statement, self.tracking_params(tracking)
            ).fetchone()
        if row is None:
            raise _tracking_conflict(tracking)

    @_retry_reads
    def max_tracking_id(self, application_name: str) -> int | None:
        with self.connection() as conn:
            row = conn.execute(
                self.max_tracking_id_statement,
                {"application": self.config.application, "upstream": application_name},
            ).fetchone()
        return None if row is None else int(row[0])


def _tracking_conflict(tracking: Tracking) -> IntegrityError:
    return IntegrityError(
        f"notification {tracking.notification_id} of {tracking.application_name!r} is at or "
        "below the last one recorded as processed"
    )


class TributaryProcessRecorder(
    TributaryTrackingRecorder, TributaryApplicationRecorder, ProcessRecorder
):
    """Events and the tracking record of the notification that caused them, in one
    transaction."""

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        tracking: Tracking | None = kwargs.get("tracking")
        if tracking is None:
            return super().insert_events(stored_events, **kwargs)
        if not stored_events:
            self.insert_tracking(tracking)
            return None
        with self.connection() as conn, conn.transaction():
            with conn.pipeline():
                tracked = conn.execute(
                    self.insert_tracking_statement, self.tracking_params(tracking)
                )
                ids = self.write_events(conn, stored_events)
            if tracked.fetchone() is None:
                raise _tracking_conflict(tracking)
        return ids


class TributarySnapshotRecorder(TributaryRecorder, AggregateRecorder):
    """Snapshots (and any other aggregate records that are not events) in ``es_snapshots``:
    a cache, never published."""

    def __init__(
        self, datastore: PostgresDatastore, config: RecorderConfig, purpose: str = "snapshots"
    ) -> None:
        super().__init__(datastore, config)
        self.purpose = purpose
        s = self.schema
        self.insert_statement = (
            f"INSERT INTO {s}.es_snapshots (application, purpose, originator_id, "
            "originator_version, topic, state) "
            "SELECT %(application)s, %(purpose)s, e.* FROM unnest(%(ids)b::text[], "
            "%(versions)b::bigint[], %(topics)b::text[], %(states)b::bytea[]) AS e"
        )
        self._select: dict[tuple[bool, bool, bool, bool], str] = {}

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> None:
        if not stored_events:
            return
        params = {
            "application": self.config.application,
            "purpose": self.purpose,
            "ids": [self.stream_id(e.originator_id) for e in stored_events],
            "versions": [e.originator_version for e in stored_events],
            "topics": [e.topic for e in stored_events],
            "states": [e.state for e in stored_events],
        }
        with self.connection() as conn:
            conn.execute(self.insert_statement, params)

    def _statement(self, gt: bool, lte: bool, desc: bool, limit: bool) -> str:
        key = (gt, lte, desc, limit)
        statement = self._select.get(key)
        if statement is None:
            where = [
                "application = %(application)s",
                "purpose = %(purpose)s",
                "originator_id = %(id)s",
            ]
            column = (
                "originator_id::uuid"
                if self.config.originator_id_type == "uuid"
                else "originator_id"
            )
            statement = _select_statement(
                f"{column}, originator_version, topic, state FROM {self.schema}.es_snapshots",
                where,
                "originator_version",
                *key,
            )
            self._select[key] = statement
        return statement

    @_retry_reads
    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        statement = self._statement(gt is not None, lte is not None, desc, limit is not None)
        params: dict[str, Any] = {
            "application": self.config.application,
            "purpose": self.purpose,
            "id": self.stream_id(originator_id),
        }
        for name, value in (("gt", gt), ("lte", lte), ("limit", limit)):
            if value is not None:
                params[name] = value
        with self.connection() as conn:
            rows = fetch_rows(conn, statement, params)
        return _stored_events(rows)
