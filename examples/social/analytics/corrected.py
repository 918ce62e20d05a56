"""Device-clock correction: every activity event with its three raw timestamps and the
corrected event time (``event_time + received_time - sent_time``, never after the server
received it), the device's clock offset, the delay and whether it is beyond the allowed
lateness. Stateless: one row per event, keyed by its id (a re-sent record changes nothing)."""

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
from examples.social.analytics.stateful import FORGOTTEN
from projections.time import folded_columns, iso, key_json, late_columns, one_branch
from projections.view import Query, QueryParam, View

COLUMNS = (
    TypedColumn("event_id", "text"),
    TypedColumn("type", "text"),
    TypedColumn("session_id", "text"),
    TypedColumn("user_id", "bigint"),
    TypedColumn("query", "text"),
    TypedColumn("search_id", "text"),
    TypedColumn("post_id", "bigint"),
    TypedColumn("event_time", "bigint"),
    TypedColumn("sent_time", "bigint"),
    TypedColumn("received_time", "bigint"),
    TypedColumn("clock_offset_ms", "bigint"),
    TypedColumn("corrected_time", "bigint"),
    TypedColumn("occurred_at", "timestamptz"),
    TypedColumn("delay_ms", "bigint"),
    TypedColumn("beyond_lateness", "boolean"),
)


def corrected_fold(config: AnalyticsConfig, job: str) -> Any:
    def fold(records: Any) -> Any:
        from pyspark.sql import functions as F

        ev = inputs(records, config.lateness)
        good = F.col("error").isNull() & F.col("kind").isin("search", "click")
        event = folded_columns(
            collection="events",
            key=key_json(event_id=F.col("event_id")),
            position=F.lit(1),
            fields=F.struct(
                F.col("event_id"),
                F.col("kind").alias("type"),
                F.col("session_id"),
                F.col("user_id"),
                F.col("query"),
                F.col("search_id"),
                F.col("post_id"),
                F.col("event_time"),
                F.col("sent_time"),
                F.col("received_time"),
                (F.col("received_time") - F.col("sent_time")).alias("clock_offset_ms"),
                F.col("corrected_time"),
                iso(F.col("event_ts")).alias("occurred_at"),
                F.col("delay_ms"),
                F.col("beyond").alias("beyond_lateness"),
            ),
            topic=F.col("topic"),
            partition=F.col("partition"),
            offset=F.col("offset"),
        )
        forgotten = folded_columns(
            collection=FORGOTTEN,
            key=F.col("user_id").cast("string"),
            position=F.lit(1),
            fields=F.struct(F.lit("user").alias("subject_type"), F.col("user_id")),
        )
        # One branch: each record gives its event row and, when late or refused, that row too;
        # a forgotten user's record its ``forgotten`` entry.
        is_forgotten = F.col("error").isNull() & (F.col("kind") == F.lit(FORGOTTEN))
        return one_branch(
            ev, [(good, event), late_columns(config.name(job)), (is_forgotten, forgotten)]
        )

    return fold


#: The outputs naming a user (purged when the user is forgotten).
HOLDERS = {"events": ("user_id",)}


def corrected_view(config: AnalyticsConfig) -> View:
    job = "activity"
    layout = typed("events", "analytics_activity", ("event_id",), *COLUMNS)
    store, also = stores(config, job, [layout], "events", holders=HOLDERS)

    def session(session_id: str, limit: int = 100) -> list[dict[str, Any]]:
        rows = read_rows(
            config,
            sql.SQL(
                "SELECT event_id, type, user_id, query, search_id, post_id, event_time,"
                " sent_time, received_time, clock_offset_ms, corrected_time, delay_ms,"
                " beyond_lateness FROM {} WHERE session_id = %s ORDER BY corrected_time,"
                " event_id LIMIT %s"
            ).format(table(config, "analytics_activity")),
            (session_id, limit),
        )
        if not rows:
            raise LookupError(f"no activity for session {session_id}")
        return rows

    return View(
        name=config.name(job),
        decode=decoder(config.kinds(), config.registry_url),
        topics=(config.activity_topic, config.subjects_topic),
        fold=corrected_fold(config, job),
        store=store,
        also=also,
        metrics=late_counter(config, store),
        verify=lambda: forgotten_held(config, store, HOLDERS),
        description="activity events with device clocks corrected (raw and corrected times)",
        queries=(
            Query(
                "activity",
                "/analytics/activity/{session_id}",
                (
                    QueryParam("session_id", str, where="path", required=True, maximum=200),
                    QueryParam("limit", int, default=100, minimum=1, maximum=10_000),
                ),
                session,
                "A front-end session's events with raw and corrected times.",
            ),
        ),
    )
