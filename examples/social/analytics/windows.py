"""Windows by event time, on Spark's ``window`` aggregations (update mode: a window is
published in the micro-batch that changes it, so a late record - within the allowed lateness -
publishes its window again, same key, newer value):

- ``hashtags``: posts per hashtag in tumbling 1-minute windows;
- ``trending``: posts per hashtag in hopping 5-minute windows advancing by 1 minute;
- ``approx``: per hour, distinct users per hashtag (HyperLogLog++, ``approx_count_distinct``)
  and the p50/p99 of the search-to-click delay (``percentile_approx``).

Each window row counts ``late_posts``: posts that reached the server after the window had
closed (they caused a correction). A window's position is its number of events: it grows
with every update, so stores keep the newest value.
"""

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
from examples.social.analytics.inputs import decoder, inputs
from projections.time import (
    HOUR_MS,
    MINUTE_MS,
    folded,
    iso,
    iso_ms,
    key_json,
    late_and_rejected,
    parse_duration,
    parse_time,
)
from projections.view import Query, QueryParam, View

HLL_RSD = 0.02  # approx_count_distinct: relative standard deviation of the estimate
PERCENTILE_ACCURACY = 10_000  # percentile_approx: rank error at most 1/accuracy of the count

WINDOW_COLUMNS = (
    TypedColumn("window_start", "timestamptz"),
    TypedColumn("window_end", "timestamptz"),
    TypedColumn("tag", "text"),
    TypedColumn("posts", "bigint"),
    TypedColumn("late_posts", "bigint"),
)


def _accepted(frame: Any, *kinds: str) -> Any:
    from pyspark.sql import functions as F

    return frame.where(F.col("error").isNull() & ~F.col("beyond") & F.col("kind").isin(*kinds))


def _late(frame: Any, job: str, *kinds: str) -> Any:
    from pyspark.sql import functions as F

    return late_and_rejected(
        frame.where(F.col("error").isNotNull() | F.col("kind").isin(*kinds)), job
    )


def post_windows(
    config: AnalyticsConfig, job: str, collection: str, size: str, slide: str | None = None
) -> Any:
    """The fold: posts per hashtag per event-time window (tumbling, or hopping by ``slide``)."""

    def fold(records: Any) -> Any:
        from pyspark.sql import functions as F

        ev = inputs(records, config.lateness)
        tags = _accepted(ev, "post").select(
            F.explode("tags").alias("tag"), "event_ts", "received_time"
        )
        windowed = tags.select(
            (
                F.window("event_ts", size) if slide is None else F.window("event_ts", size, slide)
            ).alias("w"),
            "tag",
            "received_time",
        )
        counted = windowed.groupBy("w", "tag").agg(
            F.count(F.lit(1)).alias("posts"),
            F.sum((F.col("received_time") > F.unix_millis(F.col("w.end"))).cast("long")).alias(
                "late_posts"
            ),
        )
        start, end = iso(F.col("w.start")), iso(F.col("w.end"))
        out = folded(
            counted,
            collection=collection,
            key=key_json(tag=F.col("tag"), window_start=start),
            position=F.col("posts"),
            fields=F.struct(
                start.alias("window_start"),
                end.alias("window_end"),
                F.col("tag"),
                F.col("posts"),
                F.col("late_posts"),
            ),
        )
        return out.unionByName(_late(ev, config.name(job), "post"))

    return fold


def hashtags_view(config: AnalyticsConfig) -> View:
    job = "hashtags"
    layout = typed("minutes", "analytics_hashtag_minutes", ("window_start", "tag"), *WINDOW_COLUMNS)
    store, also = stores(config, job, [layout], "minutes")
    return View(
        name=config.name(job),
        decode=decoder(config.kinds(), config.registry_url),
        topics=(config.posts_topic,),
        fold=post_windows(config, job, "minutes", "1 minute"),
        store=store,
        also=also,
        stateful=True,
        output_mode="update",
        metrics=late_counter(config, store),
        description="posts per hashtag in tumbling 1-minute event-time windows",
    )


def trending_view(config: AnalyticsConfig) -> View:
    job = "trending"
    layout = typed("windows", "analytics_trending", ("window_start", "tag"), *WINDOW_COLUMNS)
    store, also = stores(config, job, [layout], "windows")

    def trending(window: str = "5m", at: str = "", limit: int = 10) -> dict[str, Any]:
        size = parse_duration(window)
        if size not in (MINUTE_MS, 5 * MINUTE_MS):
            raise ValueError(f"window must be 1m (tumbling) or 5m (hopping), got {window!r}")
        name = "analytics_hashtag_minutes" if size == MINUTE_MS else "analytics_trending"
        if at:
            moment = parse_time(at)
        else:
            latest = read_rows(
                config,
                sql.SQL(
                    "SELECT (extract(epoch FROM max(window_start)) * 1000)::bigint AS s FROM {}"
                ).format(table(config, "analytics_hashtag_minutes")),
            )
            if not latest or latest[0]["s"] is None:
                raise LookupError("no posts counted yet")
            moment = int(latest[0]["s"])
        start = moment - moment % MINUTE_MS - (size - MINUTE_MS)
        rows = read_rows(
            config,
            sql.SQL(
                "SELECT tag, posts, late_posts FROM {} WHERE window_start = to_timestamp(%s)"
                " ORDER BY posts DESC, tag LIMIT %s"
            ).format(table(config, name)),
            (start / 1000, limit),
        )
        return {
            "window": "1m tumbling" if size == MINUTE_MS else "5m hopping by 1m",
            "window_start": iso_ms(start),
            "window_end": iso_ms(start + size),
            "hashtags": rows,
        }

    return View(
        name=config.name(job),
        decode=decoder(config.kinds(), config.registry_url),
        topics=(config.posts_topic,),
        fold=post_windows(config, job, "windows", "5 minutes", "1 minute"),
        store=store,
        also=also,
        stateful=True,
        output_mode="update",
        metrics=late_counter(config, store),
        description="posts per hashtag in hopping 5-minute windows advancing by 1 minute",
        queries=(
            Query(
                "trending",
                "/analytics/trending",
                (
                    QueryParam("window", str, default="5m", description="1m or 5m", maximum=8),
                    QueryParam(
                        "at",
                        str,
                        default="",
                        description="a time in the window (ISO-8601; default: the latest)",
                        maximum=40,
                    ),
                    QueryParam("limit", int, default=10, minimum=1, maximum=100),
                ),
                trending,
                "Top hashtags in the event-time window holding a time (default: the newest).",
            ),
        ),
    )


def approx_fold(config: AnalyticsConfig, job: str) -> Any:
    def fold(records: Any) -> Any:
        from pyspark.sql import functions as F

        ev = inputs(records, config.lateness)
        kept = _accepted(ev, "post", "click").where(
            (F.col("kind") == "post")
            | (
                (F.col("event_time") - F.col("search_time")).between(0, HOUR_MS)
                & F.col("search_time").isNotNull()
            )
        )
        is_post = F.col("kind") == "post"
        rows = kept.select(
            F.when(is_post, F.lit("hashtag")).otherwise(F.lit("click_delay")).alias("metric"),
            F.explode(F.when(is_post, F.col("tags")).otherwise(F.array(F.lit("")))).alias(
                "subject"
            ),
            "user_id",
            F.when(is_post, F.lit(None))
            .otherwise(F.col("event_time") - F.col("search_time"))
            .cast("long")
            .alias("delay_ms"),
            "event_ts",
        )
        hourly = (
            rows.select(
                F.window("event_ts", "1 hour").alias("w"),
                "metric",
                "subject",
                "user_id",
                "delay_ms",
            )
            .groupBy("w", "metric", "subject")
            .agg(
                F.count(F.lit(1)).alias("events"),
                F.approx_count_distinct("user_id", HLL_RSD).alias("distinct_users"),
                F.percentile_approx(
                    "delay_ms", F.array(F.lit(0.5), F.lit(0.99)), PERCENTILE_ACCURACY
                ).alias("p"),
            )
        )
        start = iso(F.col("w.start"))
        out = folded(
            hourly,
            collection="hourly",
            key=key_json(metric=F.col("metric"), subject=F.col("subject"), window_start=start),
            position=F.col("events"),
            fields=F.struct(
                F.col("metric"),
                F.col("subject"),
                start.alias("window_start"),
                iso(F.col("w.end")).alias("window_end"),
                F.col("events"),
                F.col("distinct_users"),
                F.col("p").getItem(0).alias("p50_ms"),
                F.col("p").getItem(1).alias("p99_ms"),
            ),
        )
        return out.unionByName(_late(ev, config.name(job), "post", "click"))

    return fold


def approx_view(config: AnalyticsConfig) -> View:
    job = "approx"
    layout = typed(
        "hourly",
        "analytics_hourly",
        ("metric", "subject", "window_start"),
        TypedColumn("metric", "text"),
        TypedColumn("subject", "text"),
        TypedColumn("window_start", "timestamptz"),
        TypedColumn("window_end", "timestamptz"),
        TypedColumn("events", "bigint"),
        TypedColumn("distinct_users", "bigint"),
        TypedColumn("p50_ms", "bigint"),
        TypedColumn("p99_ms", "bigint"),
    )
    store, also = stores(config, job, [layout], "hourly")
    bounds = {
        "distinct_users": f"HyperLogLog++ estimate, relative standard deviation {HLL_RSD:.0%}"
        f" (about 95% of estimates within {2 * HLL_RSD:.0%}; exact below a few hundred)",
        "p50_ms/p99_ms": f"percentile_approx with accuracy {PERCENTILE_ACCURACY}: the rank of"
        f" the value returned is within events/{PERCENTILE_ACCURACY} of the exact rank (exact"
        f" for fewer than {PERCENTILE_ACCURACY // 2} delays)",
    }

    def approx(tag: str = "", at: str = "", limit: int = 24) -> dict[str, Any]:
        clauses: list[sql.Composable] = [sql.SQL("true")]
        params: list[Any] = []
        if tag:
            clauses.append(sql.SQL("(metric = 'hashtag' AND subject = %s OR metric <> 'hashtag')"))
            params.append(tag.lower().lstrip("#"))
        if at:
            moment = parse_time(at)
            clauses.append(sql.SQL("window_start = to_timestamp(%s)"))
            params.append((moment - moment % HOUR_MS) / 1000)
        rows = read_rows(
            config,
            sql.SQL(
                "SELECT metric, subject, window_start, window_end, events, distinct_users,"
                " p50_ms, p99_ms FROM {} WHERE {} ORDER BY window_start DESC, metric, subject"
                " LIMIT %s"
            ).format(table(config, "analytics_hourly"), sql.SQL(" AND ").join(clauses)),
            (*params, limit),
        )
        for row in rows:
            row["window_start"] = row["window_start"].isoformat()
            row["window_end"] = row["window_end"].isoformat()
        return {"hours": rows, "error_bounds": bounds}

    return View(
        name=config.name(job),
        decode=decoder(config.kinds(), config.registry_url),
        topics=(config.posts_topic, config.activity_topic),
        fold=approx_fold(config, job),
        store=store,
        also=also,
        stateful=True,
        output_mode="update",
        metrics=late_counter(config, store),
        description="hourly distinct users per hashtag (HLL) and search-to-click delay p50/p99",
        queries=(
            Query(
                "approx",
                "/analytics/approx",
                (
                    QueryParam("tag", str, default="", maximum=100),
                    QueryParam("at", str, default="", maximum=40),
                    QueryParam("limit", int, default=24, minimum=1, maximum=1000),
                ),
                approx,
                "Hourly distinct users per hashtag and search-to-click delay percentiles.",
            ),
        ),
    )
