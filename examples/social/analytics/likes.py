"""Likes enriched with the liker's and the author's profile *as it was at the like's event time*
(the seeds' slowly changing dimension: a rename after the like does not rewrite it), from the
users table's changes (``cdc.public.users``, each version valid from its commit time).

On Spark's ``transformWithStateInPandas`` keyed by user: each user's state holds their profile
versions and the like-halves naming them (as liker or as author). A half is published with the
version valid at the like's time; when a version arrives that changes that answer (the users
topic ran behind the posts topic), the half is published again - a correction, same key, newer
position. A half leaves the state on an event-time timer once the watermark is ``allowed +
slack`` past the like (no version can change it any more). A second processor, keyed by a bucket
of like ids, joins the two halves of a like into one enriched entry (its state: the latest half
of each side, until the same watermark passes). The two are chained: each record is read once.
"""

import json
from collections.abc import Iterator, Sequence
from typing import Any

from psycopg import sql

from connectors.stores.pg_tables import TypedColumn
from examples.social.analytics.common import (
    AnalyticsConfig,
    Layout,
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
    forgotten_users,
    iso,
    late_values,
    put_values,
    replace_timer,
    to_every_key,
)
from projections.folding import FOLDED_DDL
from projections.time import window_key
from projections.view import Query, QueryParam, View
from spark_streaming.deferred_processor import DeferredProcessor

PARTS, LIKES = "like_parts", "likes"
ROLES = ("liker", "author")
VERSION_STATE = "valid_from long, lsn long, deleted boolean, profile string"
LIKE_KEY = "part string"  # <like id>:<role>
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
        "liked_ms": liked_ms,
    }


def _processor(retention_ms: int, job: str) -> Any:
    import pandas as pd  # type: ignore[import-untyped]
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class LikeProcessor(StatefulProcessor):
        """Per user: the profile's versions and the halves of likes naming the user; each
        half published with the version valid at the like's time, again when a later-arriving
        version changes that answer. Records beyond the allowed lateness and refused ones pass
        through as the job's ``late`` entries and dead letters; a user's ``SubjectForgotten``
        empties the user's state (profile versions and halves) and passes through as the
        job's ``forgotten`` entry, by which the store's materializer purges the likes naming
        the user."""

        def init(self, handle: Any) -> None:
            self.handle = handle
            self.versions = handle.getListState("versions", VERSION_STATE)
            self.likes = handle.getMapState("likes", LIKE_KEY, LIKE_STATE)
            self.revisions = Revisions(handle)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            user = int(key[0])
            frame = pd.concat(list(rows), ignore_index=True)
            passing = frame["role"] == "late"
            late = late_values(frame[passing], job)
            forgotten = user in forgotten_users(frame[passing])
            frame = frame[~passing]
            if forgotten:  # nothing of the user's is kept, nor published again
                self.versions.clear()
                self.likes.clear()
                frame = frame[0:0]
            # The chained join refuses a row at or below the watermark (a batch that does not
            # move it, the first one of a replay among them): stamp every row above it.
            watermark = int(timerValues.getCurrentWatermarkInMs())
            out = self._halves(user, frame, watermark) if len(frame) else []
            if out or late:
                result = pd.DataFrame(out + late, columns=[*FOLDED_FIELDS, "ts"])
                result["ts"] = pd.to_datetime(
                    result["ts"].fillna(watermark + 1).astype("int64"), unit="ms"
                )
                for name in ("position", "partition", "offset"):
                    result[name] = result[name].astype("Int64")
                for name in ("deleted", "fresh"):
                    result[name] = result[name].astype("boolean")
                yield result

        def _halves(self, user: int, frame: Any, watermark: int) -> list[dict[str, Any]]:
            versions: dict[int, Version] = {
                int(v[1]): (int(v[0]), int(v[1]), bool(v[2]), v[3]) for v in self.versions.get()
            }
            grew = False
            fresh: dict[str, tuple[str, int, int, int, int]] = {}
            for row in frame.itertuples(index=False):
                if row.kind in ("user", "user_deleted"):
                    lsn = int(row.version)
                    if lsn not in versions:
                        deleted = row.kind == "user_deleted"
                        versions[lsn] = (int(row.event_time), lsn, deleted, row.profile)
                        grew = True
                else:
                    fresh[part_key(str(row.event_id), str(row.role))] = (
                        str(row.role),
                        int(row.post_id),
                        int(row.user_id),
                        int(row.other_id),
                        int(row.corrected_time),
                    )
            ordered = sorted(versions.values(), key=lambda v: (v[0], v[1]))
            if grew:
                self.versions.put(ordered)
            out: list[dict[str, Any]] = []
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
                values = put_values(
                    PARTS, part, self.revisions.next(), _part_fields(like_id, like, user, version)
                )
                values["ts"] = max(like[4], watermark + 1)
                out.append(values)
                self.likes.updateValue((part,), (*like, lsn))
            self.revisions.save()
            self._timer()
            return out

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


JOIN_BUCKETS = 8
HALVES_STATE = "halves binary"
HALF_COLUMNS = ("like_id", "role", "position", "liked_ms", "fields")


def join_step(stored: Any, halves: Any) -> tuple[Any, list[dict[str, Any]]]:
    """The halves of likes (pandas: ``like_id``, ``role``, ``position``, ``liked_ms``,
    ``fields`` as JSON) after a batch's halves, and the enriched like of every like a half of
    which changed: its fields from both halves (a missing half's names null), its position the
    sum of the halves' positions (each grows, so the sum does)."""
    import pandas as pd

    both = pd.concat([stored, halves], ignore_index=True) if len(stored) else halves
    both = both.sort_values("position", kind="stable").drop_duplicates(
        ["like_id", "role"], keep="last"
    )
    changed = set(halves["like_id"])
    out: list[dict[str, Any]] = []
    touched = both[both["like_id"].isin(changed)].sort_values(["like_id", "role"])
    for like_id, group in touched.groupby("like_id", sort=True):
        by_role = {r.role: r for r in group.itertuples(index=False)}
        parsed = {role: json.loads(r.fields) for role, r in by_role.items()}
        some = next(iter(parsed.values()))
        fields = {
            "like_id": like_id,
            "post_id": some["post_id"],
            "liker_id": some["liker_id"],
            "author_id": some["author_id"],
            "liked_at": some["liked_at"],
            **_named(parsed.get("liker"), "liker"),
            **_named(parsed.get("author"), "author"),
        }
        position = sum(int(r.position) for r in by_role.values())
        out.append(put_values(LIKES, window_key(like_id=like_id), position, fields))
    return both.reset_index(drop=True), out


def without_users(halves: Any, users: set[int]) -> Any:
    """The halves of likes whose liker and author are none of ``users`` (forgotten)."""
    if not users or not len(halves):
        return halves
    parsed = [json.loads(f) for f in halves["fields"]]
    keep = [p.get("liker_id") not in users and p.get("author_id") not in users for p in parsed]
    return halves[keep].reset_index(drop=True)


def _named(fields: dict[str, Any] | None, prefix: str) -> dict[str, Any]:
    if fields is None:
        return {f"{prefix}_handle": None, f"{prefix}_name": None, f"{prefix}_version": None}
    return {
        f"{prefix}_handle": fields.get("handle"),
        f"{prefix}_name": fields.get("display_name"),
        f"{prefix}_version": fields.get("version_lsn"),
    }


def _join_processor(retention_ms: int) -> Any:
    import pandas as pd
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class JoinProcessor(StatefulProcessor):
        """A bucket of likes: the latest half of each side (Arrow IPC in one state value) until
        the watermark passes the like's time + allowed lateness + slack (no version can change
        it any more); other rows pass through. A user's ``forgotten`` entry (a copy reaches
        every bucket) drops every half naming the user, as liker or author."""

        def init(self, handle: Any) -> None:
            self.state = handle.getValueState("halves", HALVES_STATE)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            frame = pd.concat(list(rows), ignore_index=True)
            is_half = frame["collection"] == PARTS
            # a forget reaches every bucket; it passes through from bucket 0 only
            echo = frame["echo"].fillna(False).astype(bool)
            out = frame[~is_half & ~echo][list(FOLDED_FIELDS)]
            forgotten = {
                int(k) for k in frame.loc[frame["collection"] == FORGOTTEN, "key"].dropna()
            }
            if is_half.any() or (forgotten and self.state.exists()):
                new = frame[is_half]
                parsed = [json.loads(f) for f in new["fields"]]
                halves = pd.DataFrame(
                    {
                        "like_id": [p["like_id"] for p in parsed],
                        "role": [p["role"] for p in parsed],
                        "position": new["position"].astype("int64").to_numpy(),
                        "liked_ms": [int(p["liked_ms"]) for p in parsed],
                        "fields": new["fields"].to_numpy(),
                    },
                    columns=list(HALF_COLUMNS),
                )
                stored = self.state.get() if self.state.exists() else None
                before = (
                    pa.ipc.open_stream(stored[0]).read_all().to_pandas()
                    if stored
                    else halves.iloc[0:0]
                )
                state, joined = join_step(before, halves) if len(halves) else (before, [])
                state = without_users(state, forgotten)
                watermark = int(timerValues.getCurrentWatermarkInMs())
                state = state[state["liked_ms"].astype("int64") + retention_ms > watermark]
                if len(state):
                    table = pa.Table.from_pandas(state[list(HALF_COLUMNS)], preserve_index=False)
                    sink = pa.BufferOutputStream()
                    with pa.ipc.new_stream(sink, table.schema) as writer:
                        writer.write_table(table)
                    self.state.update((bytes(sink.getvalue().to_pybytes()),))
                else:
                    self.state.clear()
                out = pd.concat(
                    [out, pd.DataFrame(joined, columns=list(FOLDED_FIELDS))], ignore_index=True
                )
            if len(out):
                for name in ("position", "partition", "offset"):
                    out[name] = out[name].astype("Int64")
                for name in ("deleted", "fresh"):
                    out[name] = out[name].astype("boolean")
                yield out

        def close(self) -> None:
            pass

    return JoinProcessor()


def likes_fold(config: AnalyticsConfig, job: str) -> Any:
    lateness = config.lateness
    retention_ms = lateness.allowed_ms + lateness.slack_ms

    def fold(records: Any) -> Any:
        from pyspark.sql import functions as F

        ev = inputs(records, lateness)
        users = F.col("kind").isin("user", "user_deleted") & F.col("error").isNull()
        likes = (F.col("kind") == "like") & ~F.col("beyond") & F.col("error").isNull()
        # One chain (a second branch off the source would read the topics again): the late and
        # refused records go through the processor too, as role "late".
        # A user's SubjectForgotten goes to the user's key as a passing ("late") row.
        keyed = ev.where(
            users | F.col("kind").isin("like", FORGOTTEN) | F.col("error").isNotNull()
        ).select(
            F.explode(
                F.when(
                    likes,
                    F.array(
                        F.struct(F.col("user_id").alias("uid"), F.lit("liker").alias("role")),
                        F.struct(F.col("other_id").alias("uid"), F.lit("author").alias("role")),
                    ),
                )
                .when(
                    users,
                    F.array(
                        F.struct(
                            F.col("user_id").alias("uid"),
                            F.lit(None).cast("string").alias("role"),
                        )
                    ),
                )
                .otherwise(
                    F.array(
                        F.struct(
                            F.coalesce(F.col("user_id"), F.lit(0)).alias("uid"),
                            F.lit("late").alias("role"),
                        )
                    )
                )
            ).alias("who"),
            "user_id",
            "other_id",
            "post_id",
            "profile",
            "version",
            *LATE_INPUT,
        )
        rows = keyed.select(F.col("who.uid").alias("uid"), F.col("who.role").alias("role"), "*")
        halves = (
            rows.drop("who")
            .groupBy("uid")
            .transformWithStateInPandas(
                DeferredProcessor.of(_processor, retention_ms, config.name(job)),
                f"{FOLDED_DDL}, ts timestamp",
                "Append",
                "EventTime",
                eventTimeColumnName="ts",
            )
        )
        # The two halves of a like meet in a second processor, keyed by a bucket of like ids.
        # A user's ``forgotten`` entry reaches every bucket (each holds halves naming any user):
        # one copy per bucket, passed on from bucket 0 only.
        like_id = F.get_json_object(F.col("fields"), "$.like_id")
        spread = F.coalesce(like_id, F.col("key"), F.lit(""))
        forget = F.col("collection") == FORGOTTEN
        bucket = to_every_key(forget, JOIN_BUCKETS, F.pmod(F.xxhash64(spread), F.lit(JOIN_BUCKETS)))
        return (
            halves.withColumn("bucket", bucket)
            .withColumn("echo", forget & (F.col("bucket") > 0))
            .groupBy("bucket")
            .transformWithStateInPandas(
                DeferredProcessor.of(_join_processor, retention_ms),
                FOLDED_DDL,
                "Append",
                "EventTime",
            )
        )

    return fold


#: The outputs naming a user (purged when the user is forgotten).
HOLDERS = {LIKES: ("liker_id", "author_id")}


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
    store, also = stores(config, job, layouts, LIKES, holders=HOLDERS)

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
        topics=(config.posts_topic, config.users_topic, config.subjects_topic),
        fold=likes_fold(config, job),
        store=store,
        also=also,
        stateful=True,
        metrics=late_counter(config, store),
        verify=lambda: forgotten_held(config, store, HOLDERS),
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
