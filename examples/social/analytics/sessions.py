"""User sessions: a user's activity (searches and clicks, any device) grouped into sessions that
end after 30 minutes without activity (by corrected event time), with their length and counts.

On Spark's ``transformWithStateInPandas``, the open sessions in its state store, users
processed in buckets (vectorised in pandas): each batch merges the users' new events into their
open sessions and publishes every session that changed
at once (a late event that bridges two sessions merges them: the merged session is published
and the absorbed one deleted, downstream gets its tombstone). Spark's ``session_window``
aggregation cannot do that: it runs only in append mode, which publishes a session when the
watermark passes its end - in the micro-batch after, so a replay in one batch would publish
nothing. An event-time timer per bucket drops sessions the watermark has passed (no kept event
can reach them any more): the state expires on its own.
"""

from collections.abc import Iterator
from typing import Any

import numpy as np
from psycopg import sql

from connectors.stores.pg_tables import TypedColumn
from examples.social.analytics.common import (
    AnalyticsConfig,
    forgotten_held,
    late_counter,
    read_rows,
    stores,
    table,
    typed,
)
from examples.social.analytics.inputs import decoder, inputs
from examples.social.analytics.stateful import (
    FOLDED_FIELDS,
    FORGOTTEN,
    LATE_INPUT,
    delete_values,
    forgotten_users,
    iso,
    late_values,
    passing,
    put_values,
    replace_timer,
)
from projections.folding import FOLDED_DDL
from projections.time import MINUTE_MS, window_key
from projections.view import Query, QueryParam, View
from spark_streaming.deferred_processor import DeferredProcessor

GAP_MS = 30 * MINUTE_MS
SESSIONS = "sessions"

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


BUCKETS = 16
"""Users are processed in this many buckets (``user_id mod BUCKETS``): one Spark state key per
bucket, each batch's events of a bucket merged in one vectorised step. A key per user would pay
Spark's per-key state round trips for every user in every batch."""
STATE_SCHEMA = "revision long, sessions binary"
SESSION_COLUMNS = ("user_id", "start", "last", "events", "searches", "clicks")


def sessions_step(stored: Any, events: Any, gap_ms: int, watermark: int) -> tuple[Any, Any, Any]:
    """One batch of one bucket (pandas): the bucket's open sessions after the batch's events,
    the sessions that changed (new or grown, merged) and those absorbed into another (to be
    deleted). A session ends ``gap_ms`` after its last event; a late event that bridges two
    sessions merges them. Sessions the watermark passed (``last + gap <= watermark``: no kept
    event can reach them any more) leave the state.

    ``stored``/returned sessions: :data:`SESSION_COLUMNS`; ``events``: ``user_id``, ``kind``,
    ``corrected_time``."""
    import pandas as pd  # type: ignore[import-untyped]

    t = events["corrected_time"].to_numpy(dtype=np.int64)
    search = (events["kind"] == "search").to_numpy(dtype=np.int64)
    fresh = pd.DataFrame(
        {
            "user_id": events["user_id"].to_numpy(dtype=np.int64),
            "start": t,
            "last": t,
            "events": 1,
            "searches": search,
            "clicks": 1 - search,
        }
    )
    touched = stored["user_id"].isin(fresh["user_id"])
    before, others = stored[touched], stored[~touched]
    items = pd.concat([before, fresh], ignore_index=True) if len(before) else fresh
    items = items.sort_values(["user_id", "start", "last"], kind="stable", ignore_index=True)
    user = items["user_id"].to_numpy()
    start = items["start"].to_numpy(dtype=np.int64)
    # the latest end so far within the user's items, before each item
    reach = items.groupby("user_id", sort=False)["last"].cummax().to_numpy(dtype=np.int64)
    previous = np.concatenate(([np.iinfo(np.int64).min], reach[:-1]))
    first = np.concatenate(([True], user[1:] != user[:-1]))
    opens = first | (start - previous >= gap_ms)
    items["session"] = np.cumsum(opens)
    merged = items.groupby("session", sort=True).agg(
        user_id=("user_id", "first"),
        start=("start", "min"),
        last=("last", "max"),
        events=("events", "sum"),
        searches=("searches", "sum"),
        clicks=("clicks", "sum"),
    )
    merged = merged.reset_index(drop=True)[list(SESSION_COLUMNS)].astype("int64")
    keys = ["user_id", "start"]
    old = before[list(SESSION_COLUMNS)].astype("int64")
    same = merged.merge(old, on=list(SESSION_COLUMNS), how="left", indicator=True)
    changed = merged[(same["_merge"] == "left_only").to_numpy()]
    gone = old.merge(merged[keys], on=keys, how="left", indicator=True)
    absorbed = old[(gone["_merge"] == "left_only").to_numpy()]
    state = pd.concat([others, merged], ignore_index=True) if len(others) else merged
    state = state[state["last"].astype("int64") + gap_ms > watermark].reset_index(drop=True)
    return state, changed.reset_index(drop=True), absorbed.reset_index(drop=True)


def _frame_of(data: bytes | None) -> Any:
    import pandas as pd
    import pyarrow as pa  # type: ignore[import-untyped]

    if not data:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in SESSION_COLUMNS})
    return pa.ipc.open_stream(data).read_all().to_pandas()


def _bytes_of(frame: Any) -> bytes:
    import pyarrow as pa

    table = pa.Table.from_pandas(frame[list(SESSION_COLUMNS)], preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _processor(gap_ms: int, job: str) -> Any:
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class SessionProcessor(StatefulProcessor):
        """One bucket of users: their open sessions (Arrow IPC) and the bucket's revision
        counter (the position of every entry it writes) in one value of Spark's state store,
        read and written once per batch; an event-time timer drops sessions the watermark
        passed when no event comes."""

        def init(self, handle: Any) -> None:
            self.handle = handle
            self.state = handle.getValueState("sessions", STATE_SCHEMA)

        def _load(self) -> tuple[int, Any]:
            stored = self.state.get() if self.state.exists() else None
            return (int(stored[0]) if stored else 0), _frame_of(stored[1] if stored else None)

        def _save(self, revision: int, sessions: Any) -> None:
            if len(sessions):
                self.state.update((revision, _bytes_of(sessions)))
                replace_timer(self.handle, int(sessions["last"].min()) + gap_ms)
            else:  # every session is final: the bucket's state expires
                self.state.clear()
                replace_timer(self.handle, None)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            records = pd.concat(list(rows), ignore_index=True)
            out = late_values(records, job)
            events = records[~passing(records) & records["user_id"].notna()]
            # Forgotten users' open sessions leave the state once the batch is folded (what it
            # wrote of them the materializer deletes: a replay writes and deletes the same).
            forgotten = list(forgotten_users(records))
            if not len(events):
                if forgotten:
                    revision, stored = self._load()
                    self._save(revision, stored[~stored["user_id"].isin(forgotten)])
                if out:
                    yield pd.DataFrame(out, columns=list(FOLDED_FIELDS))
                return
            revision, stored = self._load()
            watermark = int(timerValues.getCurrentWatermarkInMs())
            state, changed, absorbed = sessions_step(stored, events, gap_ms, watermark)
            for row in changed.itertuples(index=False):  # one per changed session
                revision += 1
                session = (row.start, row.last, row.events, row.searches, row.clicks)
                out.append(
                    put_values(
                        SESSIONS,
                        session_key(row.user_id, row.start),
                        revision,
                        session_fields(int(row.user_id), session),
                    )
                )
            for row in absorbed.sort_values(["user_id", "start"]).itertuples(index=False):
                revision += 1
                out.append(delete_values(SESSIONS, session_key(row.user_id, row.start), revision))
            if forgotten:
                state = state[~state["user_id"].isin(forgotten)]
            self._save(revision, state)
            if out:
                yield pd.DataFrame(out, columns=list(FOLDED_FIELDS))

        def handleExpiredTimer(
            self, key: Any, timerValues: Any, expiredTimerInfo: Any
        ) -> Iterator[Any]:
            watermark = int(timerValues.getCurrentWatermarkInMs())
            revision, stored = self._load()
            self._save(revision, stored[stored["last"] + gap_ms > watermark])
            return iter([])

        def close(self) -> None:
            pass

    return SessionProcessor()


def sessions_fold(config: AnalyticsConfig, job: str, gap_ms: int = GAP_MS) -> Any:
    def fold(records: Any) -> Any:
        from pyspark.sql import functions as F

        ev = inputs(records, config.lateness)
        # Every activity record goes to the processor (the late and the refused too): one
        # branch, so the topic is read once per batch.
        picked = ev.where(
            F.col("error").isNotNull() | F.col("kind").isin("search", "click", FORGOTTEN)
        )
        return (
            picked.select(
                F.pmod(F.coalesce(F.col("user_id"), F.lit(0)), F.lit(BUCKETS)).alias("bucket"),
                "user_id",
                *LATE_INPUT,
            )
            .groupBy("bucket")
            .transformWithStateInPandas(
                DeferredProcessor.of(_processor, gap_ms, config.name(job)),
                FOLDED_DDL,
                "Append",
                "EventTime",
            )
        )

    return fold


#: The outputs naming a user (purged when the user is forgotten).
HOLDERS = {SESSIONS: ("user_id",)}


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
    store, also = stores(config, job, [layout], SESSIONS, holders=HOLDERS)

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
        decode=decoder(config.kinds(), config.registry_url),
        topics=(config.activity_topic, config.subjects_topic),
        fold=sessions_fold(config, job),
        store=store,
        also=also,
        stateful=True,
        metrics=late_counter(config, store),
        verify=lambda: forgotten_held(config, store, HOLDERS),
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
