"""Searches joined with the clicks on their results (the seeds' example), on Spark's
stream-stream join: a click joins its search (same session, same search id) when it happened
within one hour after it (corrected event times); Spark keeps both sides in its state store
until the watermark passes the hour.

Output, besides each joined click (``clicks``, with its delay): every search as it arrives
(``searches``, status ``open``), so the click-through rate counts every search. In the
store's atomic unit a materializer

- marks a search ``clicked`` when its first click is applied (every kept click also passes
  through as a ``click_events`` entry, joined or not, and moves its partition's clock);
- emits a search with no click as ``no_click`` when its hour has expired: when the server's
  receive time seen in the search's Kafka partition passes ``search time + 1 hour + allowed
  lateness`` (no kept click can arrive after that). This clock is the data's, not Spark's
  watermark (which moves one micro-batch late), so a replay in one batch expires exactly the
  searches the live run expired;
- keeps the click-through rate per query (``queries``: searches, clicked, no click, open).
"""

from collections.abc import Sequence
from typing import Any

from psycopg import sql

from connectors.stores.base import Collection, StoreTxn
from connectors.stores.model import Applied, Put
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
from examples.social.analytics.inputs import inputs
from projections.time import HOUR_MS, folded, iso, key_json, late_and_rejected, window_key
from projections.view import Query, QueryParam, View

SEARCHES, CLICKS, QUERIES, PROGRESS = "searches", "clicks", "queries", "progress"
CLICK_EVENTS = "click_events"
OPEN, CLICKED, NO_CLICK = "open", "clicked", "no_click"
JOIN_WITHIN_MS = HOUR_MS


def search_key(search_id: str) -> str:
    return search_id


def query_key(query: str) -> str:
    return window_key(query=query)


def ctr_fold(config: AnalyticsConfig, job: str) -> Any:
    def fold(records: Any) -> Any:
        from pyspark.sql import functions as F

        ev = inputs(records, config.kinds(), config.lateness, config.registry_url)
        kept = ev.where(F.col("error").isNull() & ~F.col("beyond"))
        searches = kept.where(F.col("kind") == "search").select(
            F.col("event_id").alias("search_id"),
            F.col("session_id").alias("s_session"),
            F.col("user_id").alias("s_user"),
            F.col("query"),
            F.col("event_ts").alias("s_ts"),
            F.col("corrected_time").alias("s_ms"),
            F.col("received_time").alias("s_received"),
            F.col("partition").alias("s_partition"),
        )
        clicks = kept.where(F.col("kind") == "click").select(
            F.col("event_id").alias("click_id"),
            F.col("search_id").alias("c_search_id"),
            F.col("session_id").alias("c_session"),
            F.col("post_id"),
            F.col("event_ts").alias("c_ts"),
            F.col("corrected_time").alias("c_ms"),
            F.col("received_time").alias("c_received"),
            F.col("partition").alias("c_partition"),
        )
        joined = searches.join(
            clicks,
            F.expr(
                "c_search_id = search_id AND c_session = s_session AND c_ts >= s_ts"
                f" AND c_ts <= s_ts + INTERVAL {JOIN_WITHIN_MS // 1000} SECONDS"
            ),
            "inner",
        )
        # Every kept click also passes through (``click_events``): the materializer's clock
        # of each partition moves with every record, joined or not.
        click_events = folded(
            clicks,
            collection=CLICK_EVENTS,
            key=F.col("click_id"),
            position=F.lit(1),
            fields=F.struct(
                F.col("click_id"),
                F.col("c_search_id").alias("search_id"),
                F.col("c_session").alias("session_id"),
                F.col("post_id"),
                F.col("c_ms").alias("clicked_ms"),
                F.col("c_received").alias("received_ms"),
                F.col("c_partition").alias("partition"),
            ),
        )
        search_rows = folded(
            searches,
            collection=SEARCHES,
            key=F.col("search_id"),
            position=F.lit(1),
            fields=F.struct(
                F.col("search_id"),
                F.col("s_session").alias("session_id"),
                F.col("s_user").alias("user_id"),
                F.col("query"),
                iso(F.col("s_ts")).alias("searched_at"),
                F.col("s_ms").alias("searched_ms"),
                (F.col("s_ms") + F.lit(JOIN_WITHIN_MS)).alias("expires_ms"),
                F.col("s_received").alias("received_ms"),
                F.col("s_partition").alias("partition"),
                F.col("s_partition").alias("open_partition"),
                F.lit(OPEN).alias("status"),
                F.lit(0).alias("clicks"),
            ),
        )
        click_rows = folded(
            joined,
            collection=CLICKS,
            key=key_json(click_id=F.col("click_id")),
            position=F.lit(1),
            fields=F.struct(
                F.col("click_id"),
                F.col("search_id"),
                F.col("query"),
                F.col("s_session").alias("session_id"),
                F.col("s_user").alias("user_id"),
                F.col("post_id"),
                iso(F.col("s_ts")).alias("searched_at"),
                iso(F.col("c_ts")).alias("clicked_at"),
                (F.col("c_ms") - F.col("s_ms")).alias("delay_ms"),
                F.col("c_received").alias("received_ms"),
                F.col("c_partition").alias("partition"),
            ),
        )
        late = late_and_rejected(
            ev.where(F.col("error").isNotNull() | F.col("kind").isin("search", "click")),
            config.name(job),
        )
        return search_rows.unionByName(click_events).unionByName(click_rows).unionByName(late)

    return fold


def ctr_materializer(allowed_ms: int) -> Any:
    """Search outcomes, expiry by the partitions' receive clocks, CTR per query."""

    def materialize(txn: StoreTxn, applied: Sequence[Applied]) -> None:
        seen: dict[int, int] = {}
        new_searches: list[Put] = []
        new_clicks: list[Put] = []
        for change in applied:
            write = change.write
            if not isinstance(write, Put) or write.collection == PROGRESS:
                continue
            fields = write.fields
            partition = fields.get("partition")
            received = fields.get("received_ms", fields.get("received_time"))
            if partition is not None and received is not None:
                seen[int(partition)] = max(seen.get(int(partition), 0), int(received))
            if change.before is None and write.collection == SEARCHES:
                new_searches.append(write)
            elif change.before is None and write.collection == CLICKS:
                new_clicks.append(write)
        counts: dict[str, dict[str, int]] = {}

        def count(query: str, **deltas: int) -> None:
            entry = counts.setdefault(query, {"searches": 0, CLICKED: 0, NO_CLICK: 0, OPEN: 0})
            for name, delta in deltas.items():
                entry[name] += delta

        for search in new_searches:
            count(str(search.fields["query"]), searches=1, open=1)
        for click in sorted(new_clicks, key=lambda c: (int(c.fields["delay_ms"]), c.key)):
            entry = txn.get(SEARCHES, search_key(str(click.fields["search_id"])))
            if entry is None:
                continue
            status, query = entry.fields.get("status"), str(entry.fields["query"])
            if status != CLICKED:
                count(query, clicked=1, **{str(status): -1})
            first = entry.fields.get("first_click_ms")
            clicked_ms = int(entry.fields["searched_ms"]) + int(click.fields["delay_ms"])
            txn.put(
                SEARCHES,
                entry.key,
                {
                    **entry.fields,
                    "status": CLICKED,
                    "clicks": int(entry.fields.get("clicks") or 0) + 1,
                    "first_click_ms": clicked_ms if first is None else min(int(first), clicked_ms),
                    "open_partition": None,
                },
            )
        for partition, received in sorted(seen.items()):
            progress = txn.get(PROGRESS, str(partition))
            clock = max(received, int(progress.fields["received_ms"]) if progress else 0)
            if progress is None or clock > int(progress.fields["received_ms"]):
                txn.put(PROGRESS, str(partition), {"partition": partition, "received_ms": clock})
            for entry in txn.find(SEARCHES, "open_partition", partition):
                if int(entry.fields["expires_ms"]) + allowed_ms < clock:
                    count(str(entry.fields["query"]), no_click=1, open=-1)
                    txn.put(
                        SEARCHES,
                        entry.key,
                        {**entry.fields, "status": NO_CLICK, "open_partition": None},
                    )
        for query, deltas in sorted(counts.items()):
            stored = txn.get(QUERIES, query_key(query))
            values = {
                name: int(stored.fields.get(name) or 0) + delta if stored else delta
                for name, delta in deltas.items()
            }
            searches = values["searches"]
            txn.put(
                QUERIES,
                query_key(query),
                {
                    "query": query,
                    **values,
                    "ctr": round(values[CLICKED] / searches, 6) if searches else None,
                },
            )

    return materialize


def ctr_view(config: AnalyticsConfig) -> View:
    job = "ctr"
    layouts: list[Layout] = [
        Collection(SEARCHES, lookups=("open_partition",)),
        typed(
            CLICKS,
            "analytics_search_clicks",
            ("click_id",),
            TypedColumn("click_id", "text"),
            TypedColumn("search_id", "text"),
            TypedColumn("query", "text"),
            TypedColumn("session_id", "text"),
            TypedColumn("user_id", "bigint"),
            TypedColumn("post_id", "bigint"),
            TypedColumn("searched_at", "timestamptz"),
            TypedColumn("clicked_at", "timestamptz"),
            TypedColumn("delay_ms", "bigint"),
            TypedColumn("received_ms", "bigint"),
            TypedColumn("partition", "integer"),
        ),
        typed(
            QUERIES,
            "analytics_ctr",
            ("query",),
            TypedColumn("query", "text"),
            TypedColumn("searches", "bigint"),
            TypedColumn(CLICKED, "bigint"),
            TypedColumn(NO_CLICK, "bigint"),
            TypedColumn(OPEN, "bigint"),
            TypedColumn("ctr", "double precision"),
        ),
        Collection(PROGRESS),
        Collection(CLICK_EVENTS),
    ]
    store, also = stores(
        config, job, layouts, QUERIES, ctr_materializer(config.lateness.allowed_ms)
    )

    def ctr(query: str = "", limit: int = 50) -> Any:
        columns = sql.SQL("query, searches, clicked, no_click, open, ctr")
        if query:
            rows = read_rows(
                config,
                sql.SQL("SELECT {} FROM {} WHERE query = %s").format(
                    columns, table(config, "analytics_ctr")
                ),
                (query,),
            )
            if not rows:
                raise LookupError(f"no searches for {query!r}")
            return rows[0]
        return read_rows(
            config,
            sql.SQL("SELECT {} FROM {} ORDER BY searches DESC, query LIMIT %s").format(
                columns, table(config, "analytics_ctr")
            ),
            (limit,),
        )

    return View(
        name=config.name(job),
        topics=(config.activity_topic,),
        fold=ctr_fold(config, job),
        store=store,
        also=also,
        stateful=True,
        metrics=late_counter(config, store),
        description="searches joined with their clicks within an hour: click-through rate per"
        " query, searches with no click once their hour expired",
        queries=(
            Query(
                "ctr",
                "/analytics/ctr",
                (
                    QueryParam(
                        "query",
                        str,
                        default="",
                        maximum=200,
                        description="one query's CTR",
                        positional=True,
                    ),
                    QueryParam("limit", int, default=50, minimum=1, maximum=1000),
                ),
                ctr,
                "Click-through rate per search query (searches, clicked, no click, open).",
            ),
        ),
    )
