"""Pattern detection on Spark's ``transformWithState`` keyed by user (state and event-time
timers in the state store), alerts to ``analytics.alerts``:

- **burst**: 5 or more posts by one user within 60 seconds of event time. Occurrences are taken
  greedily in event-time order: the first post that starts a 60-second span holding 5 posts
  opens an occurrence covering that span; the next occurrence starts at a post after it. The
  decomposition depends only on the set of posts, so it is recomputed over the posts the
  watermark has not passed: a post arriving late (within the allowed lateness) can add, change
  or retract (tombstone) an occurrence that is not final yet. Steps the watermark has passed
  are final and leave the state.
- **churn**: a follow undone within 10 minutes (event time): the follow waits in the state,
  on a timer that drops it when the watermark passes its 10 minutes.

An occurrence has one key (``burst:<user>:<start>:<first post>``, ``churn:<user>:<followee>:
<follow time>``): it is written once per change, so a restart never sends an alert twice.
"""

import bisect
from collections.abc import Iterator
from typing import Any

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
    Revisions,
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

ALERTS = "alerts"
BURST_POSTS = 5
BURST_WINDOW_MS = 60_000
CHURN_WITHIN_MS = 10 * MINUTE_MS

Post = tuple[int, int]  # event time, post id
Burst = tuple[int, int, int]  # start, first post id, posts in the span


def bursts(
    posts: list[Post],
    cursor: Post | None = None,
    until: int | None = None,
    window_ms: int = BURST_WINDOW_MS,
    minimum: int = BURST_POSTS,
) -> tuple[list[Burst], Post | None]:
    """The greedy occurrences among ``posts`` (sorted) from ``cursor`` on, and where the scan
    stopped. With ``until`` (a watermark), only the steps whose span ends at or before it -
    the final ones - are taken, and the cursor returned is where the first open step starts
    (None: every post is consumed)."""
    times = [p[0] for p in posts]
    i = 0 if cursor is None else bisect.bisect_left(posts, cursor)
    found: list[Burst] = []
    while i < len(posts):
        start = posts[i][0]
        if until is not None and start + window_ms > until:
            return found, posts[i]
        j = bisect.bisect_left(times, start + window_ms, lo=i)
        if j - i >= minimum:
            found.append((start, posts[i][1], j - i))
            i = j
        else:
            i += 1
    return found, None


def burst_id(user: int, burst: Burst) -> str:
    return f"burst:{user}:{burst[0]}:{burst[1]}"


def churn_id(user: int, followee: int, followed_ms: int) -> str:
    return f"churn:{user}:{followee}:{followed_ms}"


def alert_key(alert_id: str) -> str:
    return window_key(alert_id=alert_id)


def burst_fields(user: int, burst: Burst) -> dict[str, Any]:
    start, first, count = burst
    return {
        "alert_id": burst_id(user, burst),
        "kind": "burst",
        "user_id": user,
        "other_id": None,
        "started_at": iso(start),
        "ended_at": iso(start + BURST_WINDOW_MS),
        "posts": count,
        "first_post_id": first,
    }


def churn_fields(user: int, followee: int, followed_ms: int, unfollowed_ms: int) -> dict[str, Any]:
    return {
        "alert_id": churn_id(user, followee, followed_ms),
        "kind": "churn",
        "user_id": user,
        "other_id": followee,
        "started_at": iso(followed_ms),
        "ended_at": iso(unfollowed_ms),
        "posts": None,
        "first_post_id": None,
    }


def _processor(job: str) -> Any:
    import pandas as pd  # type: ignore[import-untyped]
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class AlertProcessor(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.posts = handle.getListState("posts", "t long, post_id long")
            self.cursor = handle.getValueState("cursor", "t long, post_id long")
            self.open = handle.getMapState("open", "alert_id string", "start long, posts long")
            self.follows = handle.getMapState("follows", "followee long", "t long")
            self.revisions = Revisions(handle)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            user = int(key[0])
            frame = pd.concat(list(rows), ignore_index=True)
            through = passing(frame)
            late = late_values(frame[through], job)
            kept = frame[~through]
            out: list[dict[str, Any]] = []
            if len(kept):
                posts = {(int(p[0]), int(p[1])) for p in self.posts.get()}
                cursor = self._cursor()
                follows: list[tuple[int, str, int, int]] = []
                for row in kept.itertuples(index=False):
                    if row.kind == "post":
                        posts.add((int(row.corrected_time), int(row.post_id)))
                    else:
                        follows.append(
                            (int(row.version), row.kind, int(row.other_id), int(row.corrected_time))
                        )
                out = self._churn(user, sorted(follows))
                ordered = sorted(p for p in posts if cursor is None or p >= cursor)
                out += self._bursts(user, ordered, cursor)
                self._settle(user, ordered, cursor, int(timerValues.getCurrentWatermarkInMs()))
                self.revisions.save()
            if user in forgotten_users(frame):
                # The user's state goes once the batch is folded (what it wrote of the user the
                # materializer deletes: a replay writes and deletes the same).
                for state in (self.posts, self.cursor, self.open, self.follows):
                    state.clear()
            if out or late:
                result = pd.DataFrame(out + late, columns=list(FOLDED_FIELDS))
                for name in ("position", "partition", "offset"):
                    result[name] = result[name].astype("Int64")
                for name in ("deleted", "fresh"):
                    result[name] = result[name].astype("boolean")
                yield result

        def _cursor(self) -> Post | None:
            row = self.cursor.get() if self.cursor.exists() else None
            return None if row is None else (int(row[0]), int(row[1]))

        def _churn(
            self, user: int, follows: list[tuple[int, str, int, int]]
        ) -> list[dict[str, Any]]:
            """Follows and unfollows in stream order: an unfollow within 10 minutes alerts."""
            out = []
            for _, kind, followee, at in follows:
                if kind == "follow":
                    self.follows.updateValue((followee,), (at,))
                    continue
                followed = self.follows.getValue((followee,))
                if followed is not None and at - int(followed[0]) <= CHURN_WITHIN_MS:
                    fields = churn_fields(user, followee, int(followed[0]), at)
                    position = self.revisions.next()
                    out.append(put_values(ALERTS, alert_key(fields["alert_id"]), position, fields))
                self.follows.removeKey((followee,))
            return out

        def _bursts(
            self, user: int, ordered: list[Post], cursor: Post | None
        ) -> list[dict[str, Any]]:
            """Publish occurrences that appeared or changed, retract those that vanished."""
            now = {burst_id(user, b): b for b in bursts(ordered, cursor)[0]}
            before = {str(k[0]): (int(v[0]), int(v[1])) for k, v in self.open.iterator()}
            out = []
            for alert_id, burst in sorted(now.items()):
                if before.get(alert_id) != (burst[0], burst[2]):
                    fields = burst_fields(user, burst)
                    out.append(
                        put_values(ALERTS, alert_key(alert_id), self.revisions.next(), fields)
                    )
                    self.open.updateValue((alert_id,), (burst[0], burst[2]))
            for alert_id in sorted(set(before) - set(now)):
                out.append(delete_values(ALERTS, alert_key(alert_id), self.revisions.next()))
                self.open.removeKey((alert_id,))
            return out

        def _settle(
            self, user: int, ordered: list[Post], cursor: Post | None, watermark: int
        ) -> None:
            """Drop what the watermark made final (no kept event can change it); keep one
            timer for the next step that can become final; clear a user with nothing open."""
            final, cursor = bursts(ordered, cursor, until=watermark)
            for burst in final:
                self.open.removeKey((burst_id(user, burst),))
            kept = [p for p in ordered if cursor is not None and p >= cursor]
            if kept and cursor is not None:
                self.posts.put(kept)
                self.cursor.update(cursor)
            else:
                self.posts.clear()
                self.cursor.clear()
            for (followee,), (at,) in list(self.follows.iterator()):
                if int(at) + CHURN_WITHIN_MS < watermark:
                    self.follows.removeKey((followee,))
            deadlines = [int(at) + CHURN_WITHIN_MS for _, (at,) in self.follows.iterator()]
            if kept:
                deadlines.append(kept[0][0] + BURST_WINDOW_MS)
            replace_timer(self.handle, min(deadlines) if deadlines else None)
            if not deadlines:  # nothing can change any more: the user's state expires
                self.revisions.save()
                self.revisions.clear()

        def handleExpiredTimer(
            self, key: Any, timerValues: Any, expiredTimerInfo: Any
        ) -> Iterator[Any]:
            ordered = sorted((int(p[0]), int(p[1])) for p in self.posts.get())
            watermark = int(timerValues.getCurrentWatermarkInMs())
            self._settle(int(key[0]), ordered, self._cursor(), watermark)
            return iter([])

        def close(self) -> None:
            pass

    return AlertProcessor()


def alerts_fold(config: AnalyticsConfig, job: str) -> Any:
    def fold(records: Any) -> Any:
        from pyspark.sql import functions as F

        ev = inputs(records, config.lateness)
        kinds = ("post", "follow", "unfollow", FORGOTTEN)
        # Every record to the processor, the late and refused ones too: one branch, so the
        # topics are read once per batch.
        picked = ev.where(F.col("error").isNotNull() | F.col("kind").isin(*kinds)).select(
            F.coalesce(F.col("user_id"), F.lit(0)).alias("uid"),
            "user_id",
            "post_id",
            "other_id",
            "version",
            *LATE_INPUT,
        )
        return picked.groupBy("uid").transformWithStateInPandas(
            DeferredProcessor.of(_processor, config.name(job)), FOLDED_DDL, "Append", "EventTime"
        )

    return fold


#: The outputs naming a user (purged when the user is forgotten).
HOLDERS = {ALERTS: ("user_id", "other_id")}


def alerts_view(config: AnalyticsConfig) -> View:
    job = "alerts"
    layout = typed(
        ALERTS,
        "analytics_alerts",
        ("alert_id",),
        TypedColumn("alert_id", "text"),
        TypedColumn("kind", "text"),
        TypedColumn("user_id", "bigint"),
        TypedColumn("other_id", "bigint"),
        TypedColumn("started_at", "timestamptz"),
        TypedColumn("ended_at", "timestamptz"),
        TypedColumn("posts", "bigint"),
        TypedColumn("first_post_id", "bigint"),
    )
    store, also = stores(config, job, [layout], ALERTS, holders=HOLDERS)

    def alerts(kind: str = "", user_id: int = 0, limit: int = 50) -> list[dict[str, Any]]:
        return recent_alerts(config, kind, user_id, limit)

    return View(
        name=config.name(job),
        decode=decoder(config.kinds(), config.registry_url),
        topics=(config.posts_topic, config.follows_topic, config.subjects_topic),
        fold=alerts_fold(config, job),
        store=store,
        also=also,
        stateful=True,
        metrics=late_counter(config, store),
        verify=lambda: forgotten_held(config, store, HOLDERS),
        description="alerts: 5+ posts within 60 s (burst), a follow undone within 10 min (churn)",
        queries=(
            Query(
                "alerts",
                "/analytics/alerts",
                (
                    QueryParam("kind", str, default="", description="burst or churn", maximum=10),
                    QueryParam("user_id", int, default=0, minimum=0),
                    QueryParam("limit", int, default=50, minimum=1, maximum=1000),
                ),
                alerts,
                "Recent alerts, newest first (burst: 5+ posts in 60 s; churn: a quick unfollow).",
            ),
        ),
    )


def recent_alerts(
    config: AnalyticsConfig, kind: str = "", user_id: int = 0, limit: int = 50
) -> list[dict[str, Any]]:
    if kind not in ("", "burst", "churn"):
        raise ValueError(f"kind must be burst or churn, got {kind!r}")
    clauses: list[sql.Composable] = [sql.SQL("true")]
    params: list[Any] = []
    if kind:
        clauses.append(sql.SQL("kind = %s"))
        params.append(kind)
    if user_id:
        clauses.append(sql.SQL("user_id = %s"))
        params.append(user_id)
    rows = read_rows(
        config,
        sql.SQL(
            "SELECT alert_id, kind, user_id, other_id, started_at, ended_at, posts,"
            " first_post_id, _position AS revision FROM {} WHERE {}"
            " ORDER BY ended_at DESC, alert_id LIMIT %s"
        ).format(table(config, "analytics_alerts"), sql.SQL(" AND ").join(clauses)),
        (*params, limit),
    )
    for row in rows:
        row["started_at"] = row["started_at"].isoformat()
        row["ended_at"] = row["ended_at"].isoformat()
    return rows
