"""User sessions: a user's activity (searches and clicks, any device) grouped into sessions that
end after 30 minutes without activity (by corrected event time), with their length and counts.

On Spark's ``transformWithState`` keyed by user, the sessions in its state store: each batch
merges the user's new events into the open sessions and publishes every session that changed
at once (a late event that bridges two sessions merges them: the merged session is published
and the absorbed one deleted, downstream gets its tombstone). Spark's ``session_window``
aggregation cannot do that: it runs only in append mode, which publishes a session when the
watermark passes its end - in the micro-batch after, so a replay in one batch would publish
nothing. An event-time timer per user drops sessions the watermark has passed (no kept event
can reach them any more): the state expires on its own.
"""

from collections.abc import Iterator
from typing import Any

from psycopg import sql

from connectors.stores.pg_tables import TypedColumn
from examples.social.analytics.common import (
    AnalyticsConfig,
    late_counter,
    read_rows,
    stores,
    table,
    typed,
)
from examples.social.analytics.inputs import inputs
from examples.social.analytics.stateful import Revisions, delete_row, iso, put_row, replace_timer
from projections.folding import FOLDED_DDL
from projections.time import MINUTE_MS, late_and_rejected, window_key
from projections.view import Query, QueryParam, View

GAP_MS = 30 * MINUTE_MS
SESSIONS = "sessions"
SESSION_STATE = "start long, last long, events long, searches long, clicks long"

Session = tuple[int, int, int, int, int]  # start, last event, events, searches, clicks


def merge_sessions(items: list[Session], gap_ms: int = GAP_MS) -> list[Session]:
    """Sessions from sessions and single events (an event is ``(t, t, 1, s, c)``): sorted,
    two merge when the later starts less than ``gap_ms`` after the earlier's last event."""
    merged: list[list[int]] = []
    for start, last, events, searches, clicks in sorted(items):
        if merged and start - merged[-1][1] < gap_ms:
            current = merged[-1]
            current[1] = max(current[1], last)
            current[2] += events
            current[3] += searches
            current[4] += clicks
        else:
            merged.append([start, last, events, searches, clicks])
    return [(s, lt, e, se, c) for s, lt, e, se, c in merged]


def session_key(user_id: int, start: int) -> str:
    return window_key(session_start=iso(start), user_id=user_id)


def session_fields(user_id: int, session: Session) -> dict[str, Any]:
    start, last, events, searches, clicks = session
    return {
        "user_id": user_id,
        "session_start": iso(start),
        "session_end": iso(last),
        "length_ms": last - start,
        "events": events,
        "searches": searches,
        "clicks": clicks,
    }


def _processor(gap_ms: int) -> Any:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class SessionProcessor(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.sessions = handle.getListState("sessions", SESSION_STATE)
            self.revisions = Revisions(handle)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            user = int(key[0])
            stored: list[Session] = [tuple(int(v) for v in s) for s in self.sessions.get()]  # type: ignore[misc]
            items = list(stored)
            for row in rows:
                t = int(row["corrected_time"])
                search = 1 if row["kind"] == "search" else 0
                items.append((t, t, 1, search, 1 - search))
            merged = merge_sessions(items, gap_ms)
            before = {s[0]: s for s in stored}
            out = []
            for session in merged:
                if before.get(session[0]) != session:
                    out.append(
                        put_row(
                            SESSIONS,
                            session_key(user, session[0]),
                            self.revisions.next(),
                            session_fields(user, session),
                        )
                    )
            starts = {s[0] for s in merged}
            for start in sorted(before):
                if start not in starts:
                    out.append(
                        delete_row(SESSIONS, session_key(user, start), self.revisions.next())
                    )
            self.sessions.put(merged)
            self.revisions.save()
            replace_timer(self.handle, min(s[1] for s in merged) + gap_ms)
            yield from out

        def handleExpiredTimer(
            self, key: Any, timerValues: Any, expiredTimerInfo: Any
        ) -> Iterator[Any]:
            watermark = int(timerValues.getCurrentWatermarkInMs())
            kept = [
                s
                for s in (tuple(int(v) for v in s) for s in self.sessions.get())
                if s[1] + gap_ms > watermark
            ]
            if kept:
                self.sessions.put(kept)
                replace_timer(self.handle, min(s[1] for s in kept) + gap_ms)
            else:  # every session is final: the user's state expires
                self.sessions.clear()
                self.revisions.clear()
                replace_timer(self.handle, None)
            return iter([])

        def close(self) -> None:
            pass

    return SessionProcessor()


def sessions_fold(config: AnalyticsConfig, job: str, gap_ms: int = GAP_MS) -> Any:
    def fold(records: Any) -> Any:
        from pyspark.sql import functions as F

        ev = inputs(records, config.kinds(), config.lateness, config.registry_url)
        kept = ev.where(
            F.col("error").isNull()
            & ~F.col("beyond")
            & F.col("kind").isin("search", "click")
            & F.col("user_id").isNotNull()
        ).select("user_id", "kind", "corrected_time")
        out = kept.groupBy("user_id").transformWithState(
            _processor(gap_ms), FOLDED_DDL, "Append", "EventTime"
        )
        late = late_and_rejected(
            ev.where(F.col("error").isNotNull() | F.col("kind").isin("search", "click")),
            config.name(job),
        )
        return out.unionByName(late)

    return fold


def sessions_view(config: AnalyticsConfig) -> View:
    job = "sessions"
    layout = typed(
        SESSIONS,
        "analytics_sessions",
        ("user_id", "session_start"),
        TypedColumn("user_id", "bigint"),
        TypedColumn("session_start", "timestamptz"),
        TypedColumn("session_end", "timestamptz"),
        TypedColumn("length_ms", "bigint"),
        TypedColumn("events", "bigint"),
        TypedColumn("searches", "bigint"),
        TypedColumn("clicks", "bigint"),
    )
    store, also = stores(config, job, [layout], SESSIONS)

    def sessions(user_id: int, limit: int = 20) -> list[dict[str, Any]]:
        rows = read_rows(
            config,
            sql.SQL(
                "SELECT session_start, session_end, length_ms, events, searches, clicks FROM {}"
                " WHERE user_id = %s ORDER BY session_start DESC LIMIT %s"
            ).format(table(config, "analytics_sessions")),
            (user_id, limit),
        )
        if not rows:
            raise LookupError(f"no sessions of user {user_id}")
        for row in rows:
            row["session_start"] = row["session_start"].isoformat()
            row["session_end"] = row["session_end"].isoformat()
        return rows

    return View(
        name=config.name(job),
        topics=(config.activity_topic,),
        fold=sessions_fold(config, job),
        store=store,
        also=also,
        stateful=True,
        metrics=late_counter(config, store),
        description="user sessions (30-minute gap) with their length and counts",
        queries=(
            Query(
                "sessions",
                "/analytics/sessions/{user_id}",
                (
                    QueryParam("user_id", int, where="path", required=True, minimum=1),
                    QueryParam("limit", int, default=20, minimum=1, maximum=1000),
                ),
                sessions,
                "A user's sessions, newest first: start, end, length, events, searches, clicks.",
            ),
        ),
    )
