"""Likes enriched with the liker's and the author's profile *as it was at the like's event time*
(the seeds' slowly changing dimension: a rename after the like does not rewrite it), from the
users table's changes (``cdc.public.users``, each version valid from its commit time).

On Spark's ``transformWithState`` keyed by user: each user's state holds their profile versions
and the like-halves naming them (as liker or as author). A half is published with the version
valid at the like's time; when a version arrives that changes that answer (the users topic ran
behind the posts topic), the half is published again - a correction, same key, newer position.
A half leaves the state on an event-time timer once the watermark is ``allowed + slack`` past
the like (no version can change it any more). A materializer joins the two halves of a like
into one enriched entry, in the store's atomic unit.
"""

import json
from collections.abc import Iterator, Sequence
from typing import Any

from psycopg import sql

from connectors.stores.pg_tables import TypedColumn
from examples.social.analytics.common import (
    AnalyticsConfig,
    Layout,
    late_counter,
    read_rows,
    stores,
    table,
    typed,
)
from examples.social.analytics.inputs import decoder, inputs
from examples.social.analytics.stateful import Revisions, iso, put_row, replace_timer
from projections.folding import FOLDED_DDL
from projections.time import folded, key_json, late_and_rejected
from projections.view import Query, QueryParam, View

PARTS, LIKES = "like_parts", "likes"
ROLES = ("liker", "author")
VERSION_STATE = "valid_from long, lsn long, deleted boolean, profile string"
LIKE_KEY = "part string"  # <like id>:<role>
HALF_DDL = (
    "like_id string, role string, post_id long, liker_id long, author_id long, liked_at string,"
    " handle string, display_name string, version_lsn long"
)
LIKE_STATE = (
    "role string, post_id long, liker_id long, author_id long, liked_ms long, shown_lsn long"
)

Version = tuple[int, int, bool, str | None]


def as_of(versions: Sequence[Version], at: int) -> Version | None:
    """The version valid at ``at``: the newest with ``valid_from <= at`` (ties: highest LSN)."""
    found: Version | None = None
    for version in versions:  # sorted by (valid_from, lsn)
        if version[0] <= at:
            found = version
        else:
            break
    return found


def part_key(like_id: str, role: str) -> str:
    return f"{like_id}:{role}"


def _part_fields(
    like_id: str, like: tuple[str, int, int, int, int], user_id: int, version: Version | None
) -> dict[str, Any]:
    role, post_id, liker_id, author_id, liked_ms = like
    profile = json.loads(version[3]) if version is not None and version[3] else {}
    return {
        "like_id": like_id,
        "role": role,
        "post_id": post_id,
        "liker_id": liker_id,
        "author_id": author_id,
        "liked_at": iso(liked_ms),
        "user_id": user_id,
        "handle": profile.get("handle"),
        "display_name": profile.get("display_name"),
        "version_lsn": None if version is None else version[1],
        "version_from": None if version is None else iso(version[0]),
        "user_deleted": version is not None and version[2],
    }


def _processor(retention_ms: int) -> Any:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class LikeProcessor(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.versions = handle.getListState("versions", VERSION_STATE)
            self.likes = handle.getMapState("likes", LIKE_KEY, LIKE_STATE)
            self.revisions = Revisions(handle)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            user = int(key[0])
            # The chained aggregation drops rows older than the watermark: never stamp below it.
            watermark = int(timerValues.getCurrentWatermarkInMs())
            versions: dict[int, Version] = {
                int(v[1]): (int(v[0]), int(v[1]), bool(v[2]), v[3]) for v in self.versions.get()
            }
            grew = False
            fresh: dict[str, tuple[str, int, int, int, int]] = {}
            for row in rows:
                if row["kind"] in ("user", "user_deleted"):
                    lsn = int(row["version"])
                    if lsn not in versions:
                        deleted = row["kind"] == "user_deleted"
                        versions[lsn] = (int(row["event_time"]), lsn, deleted, row["profile"])
                        grew = True
                else:
                    fresh[part_key(str(row["event_id"]), str(row["role"]))] = (
                        str(row["role"]),
                        int(row["post_id"]),
                        int(row["user_id"]),
                        int(row["other_id"]),
                        int(row["corrected_time"]),
                    )
            ordered = sorted(versions.values(), key=lambda v: (v[0], v[1]))
            if grew:
                self.versions.put(ordered)
            out = []
            candidates: list[tuple[str, tuple[str, int, int, int, int], int | None]] = []
            if grew:
                for (part,), stored in self.likes.iterator():
                    if part not in fresh:
                        like = (str(stored[0]), *(int(v) for v in stored[1:5]))
                        candidates.append((part, like, int(stored[5])))  # type: ignore[arg-type]
            for part, like in fresh.items():
                stored = self.likes.getValue((part,))
                candidates.append((part, like, None if stored is None else int(stored[5])))
            for part, like, shown in sorted(candidates):
                like_id = part.rsplit(":", 1)[0]
                version = as_of(ordered, like[4])
                lsn = -1 if version is None else version[1]
                if shown is not None and shown == lsn:
                    continue
                out.append(
                    put_row(
                        PARTS,
                        part,
                        self.revisions.next(),
                        _part_fields(like_id, like, user, version),
                        ts=max(like[4], watermark),
                    )
                )
                self.likes.updateValue((part,), (*like, lsn))
            self.revisions.save()
            self._timer()
            yield from out

        def _timer(self) -> None:
            expiries = [int(v[4]) + retention_ms for v in self.likes.values()]
            replace_timer(self.handle, min(expiries) if expiries else None)

        def handleExpiredTimer(
            self, key: Any, timerValues: Any, expiredTimerInfo: Any
        ) -> Iterator[Any]:
            watermark = int(timerValues.getCurrentWatermarkInMs())
            for (part,), stored in list(self.likes.iterator()):
                if int(stored[4]) + retention_ms <= watermark:
                    self.likes.removeKey((part,))
            self._timer()
            return iter([])

        def close(self) -> None:
            pass

    return LikeProcessor()


def likes_fold(config: AnalyticsConfig, job: str) -> Any:
    lateness = config.lateness
    retention_ms = lateness.allowed_ms + lateness.slack_ms

    def fold(records: Any) -> Any:
        from pyspark.sql import functions as F

        ev = inputs(records, lateness)
        users = F.col("kind").isin("user", "user_deleted")
        likes = (F.col("kind") == "like") & ~F.col("beyond")
        keyed = ev.where(F.col("error").isNull() & (users | likes)).select(
            F.explode(
                F.when(
                    F.col("kind") == "like",
                    F.array(
                        F.struct(F.col("user_id").alias("uid"), F.lit("liker").alias("role")),
                        F.struct(F.col("other_id").alias("uid"), F.lit("author").alias("role")),
                    ),
                ).otherwise(
                    F.array(
                        F.struct(
                            F.col("user_id").alias("uid"),
                            F.lit(None).cast("string").alias("role"),
                        )
                    )
                )
            ).alias("who"),
            "kind",
            "event_id",
            "user_id",
            "other_id",
            "post_id",
            "profile",
            "version",
            "event_time",
            "corrected_time",
        )
        rows = keyed.select(F.col("who.uid").alias("uid"), F.col("who.role").alias("role"), "*")
        halves = (
            rows.drop("who")
            .groupBy("uid")
            .transformWithState(
                _processor(retention_ms),
                f"{FOLDED_DDL}, ts timestamp",
                "Append",
                "EventTime",
                eventTimeColumnName="ts",
            )
            .select(F.from_json("fields", HALF_DDL).alias("h"), "position")
        )
        # The two halves of a like meet in Spark's state: the latest of each (by position).
        liker, author = (F.col("h.role") == "liker"), (F.col("h.role") == "author")
        shown = F.struct("h.handle", "h.display_name", "h.version_lsn")
        likes = halves.groupBy(F.col("h.like_id").alias("like_id")).agg(
            F.max("h.post_id").alias("post_id"),
            F.max("h.liker_id").alias("liker_id"),
            F.max("h.author_id").alias("author_id"),
            F.max("h.liked_at").alias("liked_at"),
            F.max_by(shown, F.when(liker, F.col("position"))).alias("liker"),
            F.max_by(shown, F.when(author, F.col("position"))).alias("author"),
            F.max(F.when(liker, F.col("position"))).alias("liker_position"),
            F.max(F.when(author, F.col("position"))).alias("author_position"),
        )
        joined = folded(
            likes,
            collection=LIKES,
            key=key_json(like_id=F.col("like_id")),
            position=F.coalesce(F.col("liker_position"), F.lit(0))
            + F.coalesce(F.col("author_position"), F.lit(0)),
            fields=F.struct(
                "like_id",
                "post_id",
                "liker_id",
                "author_id",
                "liked_at",
                F.col("liker.handle").alias("liker_handle"),
                F.col("liker.display_name").alias("liker_name"),
                F.col("liker.version_lsn").alias("liker_version"),
                F.col("author.handle").alias("author_handle"),
                F.col("author.display_name").alias("author_name"),
                F.col("author.version_lsn").alias("author_version"),
            ),
        )
        late = late_and_rejected(
            ev.where(F.col("error").isNotNull() | (F.col("kind") == "like")), config.name(job)
        )
        return joined.unionByName(late)

    return fold


def likes_view(config: AnalyticsConfig) -> View:
    job = "likes"
    layouts: list[Layout] = [
        typed(
            LIKES,
            "analytics_likes",
            ("like_id",),
            TypedColumn("like_id", "text"),
            TypedColumn("post_id", "bigint"),
            TypedColumn("liker_id", "bigint"),
            TypedColumn("author_id", "bigint"),
            TypedColumn("liked_at", "timestamptz"),
            TypedColumn("liker_handle", "text"),
            TypedColumn("liker_name", "text"),
            TypedColumn("liker_version", "bigint"),
            TypedColumn("author_handle", "text"),
            TypedColumn("author_name", "text"),
            TypedColumn("author_version", "bigint"),
        ),
    ]
    store, also = stores(config, job, layouts, LIKES)

    def likes(post_id: int, limit: int = 100) -> list[dict[str, Any]]:
        rows = read_rows(
            config,
            sql.SQL(
                "SELECT like_id, liker_id, liker_handle, liker_name, author_id, author_handle,"
                " author_name, liked_at FROM {} WHERE post_id = %s ORDER BY liked_at, like_id"
                " LIMIT %s"
            ).format(table(config, "analytics_likes")),
            (post_id, limit),
        )
        if not rows:
            raise LookupError(f"no likes of post {post_id}")
        for row in rows:
            row["liked_at"] = row["liked_at"].isoformat()
        return rows

    return View(
        name=config.name(job),
        decode=decoder(config.kinds(), config.registry_url),
        topics=(config.posts_topic, config.users_topic),
        fold=likes_fold(config, job),
        store=store,
        also=also,
        stateful=True,
        output_mode="update",
        metrics=late_counter(config, store),
        description="likes with the liker's and the author's profile as of the like",
        queries=(
            Query(
                "likes",
                "/analytics/likes/{post_id}",
                (
                    QueryParam("post_id", int, where="path", required=True, minimum=1),
                    QueryParam("limit", int, default=100, minimum=1, maximum=1000),
                ),
                likes,
                "A post's likes, each with the liker's and the author's names as of the like.",
            ),
        ),
    )
