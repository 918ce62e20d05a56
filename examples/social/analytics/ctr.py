"""Searches joined with the clicks on their results (the seeds' example): a click joins its
search (same session, same search id) when it happened within one hour after it (corrected
event times); every search ends ``clicked``, or ``no_click`` once its hour has expired, and the
click-through rate is kept per query.

All of it runs in Spark's state store (RocksDB), in two chained stateful operators:

1. ``transformWithStateInPandas`` keyed by the activity topic's Kafka partition (the activity is
   keyed by session, so a search and its clicks share a partition). Per partition the state
   holds the searches still within reach, clicks that came before their search, and the
   partition's *clock*: the largest server receive time seen in it. Each batch, vectorised in
   pandas: new searches are added (``open``), clicks matched (a click joins; its search becomes
   ``clicked``), and every open search whose ``search time + 1 hour + allowed lateness`` the
   clock passed becomes ``no_click`` (no kept click can arrive after that). The clock is the
   data's, not Spark's watermark (which moves one micro-batch late), so a replay in one batch
   expires exactly the searches a live run in many batches expired. It publishes every search
   that changed, every joined click, and per query the changes of its counts.
2. A streaming aggregation per query (update mode) sums those changes: searches, clicked, no
   click, open, and the click-through rate.
"""

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
from psycopg import sql

from connectors.stores.base import Collection
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
from examples.social.analytics.stateful import FOLDED_FIELDS, LATE_INPUT, late_values
from projections.folding import FOLDED_DDL
from projections.time import HOUR_MS, iso_ms, window_key
from projections.view import Query, QueryParam, View

SEARCHES, CLICKS, QUERIES = "searches", "clicks", "queries"
OPEN, CLICKED, NO_CLICK = "open", "clicked", "no_click"
JOIN_WITHIN_MS = HOUR_MS

SEARCH_COLUMNS = (
    "search_id",
    "session_id",
    "user_id",
    "query",
    "searched_ms",
    "received_ms",
    "status",
    "clicks",
    "first_click_ms",
    "revision",
    "click_ids",
)
WAITING_COLUMNS = ("click_id", "search_id", "session_id", "post_id", "clicked_ms", "received_ms")
STATE_SCHEMA = "clock long, searches binary, waiting binary"
DELTAS = ("d_searches", "d_clicked", "d_no_click", "d_open")
OUTPUT_DDL = (
    "collection string, key string, position long, deleted boolean, fields string,"
    " member string, changes array<long>, fresh boolean, topic string, partition int,"
    " offset long, error string, raw_key binary, raw_value binary, d_query string,"
    " d_searches long, d_clicked long, d_no_click long, d_open long, ts timestamp"
)


def search_key(search_id: str) -> str:
    return search_id


def query_key(query: str) -> str:
    return window_key(query=query)


# -- one partition's step (pure: pandas in, pandas out) ---------------------------------------


def _empty(columns: tuple[str, ...]) -> Any:
    import pandas as pd  # type: ignore[import-untyped]

    return pd.DataFrame({c: pd.Series(dtype="object") for c in columns})


def _frame_bytes(frame: Any) -> bytes:
    import pyarrow as pa  # type: ignore[import-untyped]

    table = pa.Table.from_pandas(frame, preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _frame_of(data: bytes | None, columns: tuple[str, ...]) -> Any:
    import pyarrow as pa

    if not data:
        return _empty(columns)
    return pa.ipc.open_stream(data).read_all().to_pandas()


def ctr_step(
    partition: int,
    clock: int,
    searches: Any,
    waiting: Any,
    rows: Any,
    allowed_ms: int,
) -> tuple[int, Any, Any, list[dict[str, Any]], Any]:
    """One batch of one partition: the new clock, searches and waiting clicks, the output rows
    (changed searches and joined clicks, as folded values) and the count changes per query.

    ``rows``: the batch's decoded records of the partition (``kind``, ``kept``, ``event_id``,
    ``session_id``, ``user_id``, ``query``, ``search_id``, ``post_id``, ``corrected_time``,
    ``received_time``)."""
    import pandas as pd

    received = rows["received_time"].dropna()
    if len(received):
        clock = max(clock, int(received.max()))
    kept = rows[rows["kept"].fillna(False).astype(bool)]
    deltas: list[Any] = []
    touched: set[str] = set()

    # 1. new searches (a search already known is a re-delivery)
    new = kept[kept["kind"] == "search"].drop_duplicates("event_id")
    new = new[~new["event_id"].isin(searches["search_id"])]
    if len(new):
        added = pd.DataFrame(
            {
                "search_id": new["event_id"].astype(str).to_numpy(),
                "session_id": new["session_id"].to_numpy(),
                "user_id": new["user_id"].to_numpy(),
                "query": new["query"].fillna("").to_numpy(),
                "searched_ms": new["corrected_time"].astype("int64").to_numpy(),
                "received_ms": new["received_time"].astype("int64").to_numpy(),
                "status": OPEN,
                "clicks": 0,
                "first_click_ms": None,
                "revision": 0,
                "click_ids": "",
            }
        )
        searches = pd.concat([searches, added], ignore_index=True) if len(searches) else added
        touched.update(added["search_id"])
        deltas.append(pd.DataFrame({"d_query": added["query"], "d_searches": 1, "d_open": 1}))

    # 2. clicks: this batch's and those waiting for their search
    fresh = kept[kept["kind"] == "click"].drop_duplicates("event_id")
    clicks = pd.DataFrame(
        {
            "click_id": fresh["event_id"].astype(str).to_numpy(),
            "search_id": fresh["search_id"].to_numpy(),
            "session_id": fresh["session_id"].to_numpy(),
            "post_id": fresh["post_id"].to_numpy(),
            "clicked_ms": fresh["corrected_time"].astype("int64").to_numpy(),
            "received_ms": fresh["received_time"].astype("int64").to_numpy(),
        }
    )
    if len(waiting) and len(clicks):
        clicks = pd.concat([waiting, clicks], ignore_index=True).drop_duplicates("click_id")
    elif len(waiting):
        clicks = waiting
    joined_rows: list[dict[str, Any]] = []
    if len(clicks):
        known = clicks["search_id"].isin(searches["search_id"])
        waiting = clicks[~known].reset_index(drop=True)
        at = searches.reset_index().set_index("search_id")["index"]
        matched = clicks[known].copy()
        matched["row"] = at.loc[matched["search_id"]].to_numpy()
        s = searches.loc[matched["row"]]
        delay = matched["clicked_ms"].to_numpy() - s["searched_ms"].to_numpy().astype("int64")
        already = [
            c in ids.split(",") for c, ids in zip(matched["click_id"], s["click_ids"], strict=True)
        ]
        ok = (
            (matched["session_id"].to_numpy() == s["session_id"].to_numpy())
            & (delay >= 0)
            & (delay <= JOIN_WITHIN_MS)
            & ~np.array(already, dtype=bool)
        )
        matched, s, delay = matched[ok], s[ok], delay[ok]
        matched = matched.assign(delay_ms=delay)
        for row, group in matched.groupby("row", sort=True):
            search = searches.loc[row]
            if search["status"] == OPEN:
                deltas.append(
                    pd.DataFrame({"d_query": [search["query"]], "d_clicked": [1], "d_open": [-1]})
                )
            first = int(group["clicked_ms"].min())
            previous = search["first_click_ms"]
            searches.at[row, "status"] = CLICKED
            searches.at[row, "clicks"] = int(search["clicks"]) + len(group)
            searches.at[row, "first_click_ms"] = (
                first if previous is None or pd.isna(previous) else min(int(previous), first)
            )
            ids = [i for i in str(search["click_ids"]).split(",") if i]
            searches.at[row, "click_ids"] = ",".join([*ids, *group["click_id"]])
            touched.add(str(search["search_id"]))
        for click in matched.itertuples(index=False):
            search = searches.loc[click.row]
            joined_rows.append(
                _click_values(partition, search, click)  # one per joined click
            )
    # 3. expiry by the partition's clock
    expired = (searches["status"] == OPEN) & (
        searches["searched_ms"].astype("int64") + JOIN_WITHIN_MS + allowed_ms < clock
    )
    if expired.any():
        searches.loc[expired, "status"] = NO_CLICK
        touched.update(searches.loc[expired, "search_id"])
        deltas.append(
            pd.DataFrame({"d_query": searches.loc[expired, "query"], "d_no_click": 1, "d_open": -1})
        )
    # 4. publish what changed, then forget what no record can reach any more
    out: list[dict[str, Any]] = []
    if touched:
        changed = searches["search_id"].isin(touched)
        searches.loc[changed, "revision"] = searches.loc[changed, "revision"].astype("int64") + 1
        out.extend(_search_values(partition, r) for r in searches[changed].itertuples(index=False))
    out.extend(joined_rows)
    reach = searches["searched_ms"].astype("int64") + JOIN_WITHIN_MS + allowed_ms
    searches = searches[reach >= clock].reset_index(drop=True)
    if len(waiting):
        waiting = waiting[waiting["clicked_ms"].astype("int64") + allowed_ms >= clock]
        waiting = waiting.reset_index(drop=True)
    counts = (
        pd.concat(deltas, ignore_index=True).fillna(0)
        if deltas
        else pd.DataFrame({"d_query": pd.Series(dtype="object")})
    )
    for name in DELTAS:
        counts[name] = counts[name].astype("int64") if name in counts else 0
    return clock, searches, waiting, out, counts


def _search_values(partition: int, search: Any) -> dict[str, Any]:
    first = search.first_click_ms
    fields = {
        "search_id": search.search_id,
        "session_id": search.session_id,
        "user_id": None if search.user_id is None else int(search.user_id),
        "query": search.query,
        "searched_at": iso_ms(int(search.searched_ms)),
        "searched_ms": int(search.searched_ms),
        "expires_ms": int(search.searched_ms) + JOIN_WITHIN_MS,
        "received_ms": int(search.received_ms),
        "partition": partition,
        "status": search.status,
        "clicks": int(search.clicks),
        "first_click_ms": None if first is None or first != first else int(first),
    }
    return _values(SEARCHES, search_key(search.search_id), int(search.revision), fields)


def _click_values(partition: int, search: Any, click: Any) -> dict[str, Any]:
    fields = {
        "click_id": click.click_id,
        "search_id": click.search_id,
        "query": search["query"],
        "session_id": click.session_id,
        "user_id": None if search["user_id"] is None else int(search["user_id"]),
        "post_id": None if click.post_id is None else int(click.post_id),
        "searched_at": iso_ms(int(search["searched_ms"])),
        "clicked_at": iso_ms(int(click.clicked_ms)),
        "delay_ms": int(click.delay_ms),
        "received_ms": int(click.received_ms),
        "partition": partition,
    }
    return _values(CLICKS, window_key(click_id=click.click_id), 1, fields)


def _values(collection: str, key: str, position: int, fields: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = dict.fromkeys(FOLDED_FIELDS)
    values.update(
        collection=collection,
        key=key,
        position=position,
        deleted=False,
        fields=json.dumps(fields, separators=(",", ":")),
        fresh=False,
    )
    return values


def _processor(allowed_ms: int, job: str) -> Any:
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class CtrProcessor(StatefulProcessor):
        """One Kafka partition of the activity: its clock, searches and waiting clicks in one
        value of Spark's state store (Arrow IPC inside), read and written once per batch."""

        def init(self, handle: Any) -> None:
            self.handle = handle
            self.state = handle.getValueState("ctr", STATE_SCHEMA)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            partition = int(key[0])
            frame = pd.concat(list(rows), ignore_index=True)
            late = late_values(frame, job)
            frame = frame[frame["error"].isna()]
            stored = self.state.get() if self.state.exists() else None
            clock = int(stored[0]) if stored else 0
            searches = _frame_of(stored[1] if stored else None, SEARCH_COLUMNS)
            waiting = _frame_of(stored[2] if stored else None, WAITING_COLUMNS)
            clock, searches, waiting, out, counts = ctr_step(
                partition, clock, searches, waiting, frame, allowed_ms
            )
            self.state.update((clock, _frame_bytes(searches), _frame_bytes(waiting)))
            # The chained aggregation drops rows older than the watermark: stamp them with
            # the later of the watermark and the partition's clock.
            stamp = pd.Timestamp(max(clock, int(timerValues.getCurrentWatermarkInMs())), unit="ms")
            frames = []
            if out or late:
                frames.append(pd.DataFrame(out + late, columns=list(FOLDED_FIELDS)))
            if len(counts):
                frames.append(counts)
            if frames:
                result = pd.concat(frames, ignore_index=True)
                for name in ("d_query", *DELTAS, *FOLDED_FIELDS):
                    if name not in result:
                        result[name] = None
                for name in ("position", "partition", "offset", *DELTAS):
                    result[name] = result[name].astype("Int64")
                for name in ("deleted", "fresh"):
                    result[name] = result[name].astype("boolean")
                for name in (
                    "collection",
                    "key",
                    "fields",
                    "member",
                    "changes",
                    "topic",
                    "error",
                    "raw_key",
                    "raw_value",
                    "d_query",
                ):
                    column = result[name].astype(object)
                    result[name] = column.where(column.notna(), None)
                result["ts"] = stamp
                yield result[[*FOLDED_FIELDS, "d_query", *DELTAS, "ts"]]

        def close(self) -> None:
            pass

    return CtrProcessor()


TOTALS_BUCKETS = 8
TOTALS_STATE = "totals binary"
TOTALS_COLUMNS = ("query", "searches", "clicked", "no_click", "open", "revision")


def totals_step(stored: Any, deltas: Any) -> tuple[Any, Any]:
    """Count changes per query added to the stored totals (pandas): the new totals, and the
    queries whose totals changed (with their next revision)."""
    import pandas as pd

    sums = (
        deltas.groupby("d_query", sort=True)[list(DELTAS)]
        .sum()
        .rename(columns=lambda c: c.removeprefix("d_"))
        .reset_index()
        .rename(columns={"d_query": "query"})
    )
    merged = sums.merge(stored, on="query", how="left", suffixes=("", "_was")).fillna(0)
    for name in ("searches", "clicked", "no_click", "open"):
        merged[name] = merged[name].astype("int64") + merged[f"{name}_was"].astype("int64")
    merged["revision"] = merged["revision"].astype("int64") + 1
    changed = merged[list(TOTALS_COLUMNS)]
    others = stored[~stored["query"].isin(changed["query"])]
    totals = pd.concat([others, changed], ignore_index=True) if len(others) else changed
    return totals, changed.reset_index(drop=True)


def _totals_processor() -> Any:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class TotalsProcessor(StatefulProcessor):
        """A bucket of queries: their totals (Arrow IPC in one state value). The partition
        processor's other rows pass through: one chain, each record read once."""

        def init(self, handle: Any) -> None:
            self.state = handle.getValueState("totals", TOTALS_STATE)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            frame = pd.concat(list(rows), ignore_index=True)
            counting = frame["d_query"].notna()
            out = frame[~counting][list(FOLDED_FIELDS)]
            if counting.any():
                stored = self.state.get() if self.state.exists() else None
                totals = (
                    pa.ipc.open_stream(stored[0]).read_all().to_pandas()
                    if stored
                    else pd.DataFrame({c: pd.Series(dtype="int64") for c in TOTALS_COLUMNS})
                )
                totals, changed = totals_step(totals, frame[counting])
                self.state.update((_frame_bytes(totals),))
                rows_out = [
                    _values(
                        QUERIES,
                        query_key(str(q.query)),
                        int(q.revision),
                        {
                            "query": q.query,
                            "searches": int(q.searches),
                            CLICKED: int(q.clicked),
                            NO_CLICK: int(q.no_click),
                            OPEN: int(q.open),
                            "ctr": round(int(q.clicked) / int(q.searches), 6)
                            if int(q.searches)
                            else None,
                        },
                    )
                    for q in changed.itertuples(index=False)
                ]
                out = pd.concat(
                    [out, pd.DataFrame(rows_out, columns=list(FOLDED_FIELDS))], ignore_index=True
                )
            if len(out):
                for name in ("position", "partition", "offset"):
                    out[name] = out[name].astype("Int64")
                for name in ("deleted", "fresh"):
                    out[name] = out[name].astype("boolean")
                yield out

        def close(self) -> None:
            pass

    return TotalsProcessor()


def ctr_fold(config: AnalyticsConfig, job: str) -> Any:
    allowed_ms = config.lateness.allowed_ms

    def fold(records: Any) -> Any:
        from pyspark.sql import functions as F

        ev = inputs(records, config.lateness)
        # One chain (a second branch off the source would read the topic again): every
        # activity record to the partition's processor, its rows to the totals per query.
        activity = ev.where(F.col("error").isNotNull() | F.col("kind").isin("search", "click"))
        steps = (
            activity.select(
                F.col("partition").alias("p"),
                (F.col("kind").isin("search", "click") & ~F.col("beyond")).alias("kept"),
                "session_id",
                "user_id",
                "query",
                "search_id",
                "post_id",
                *LATE_INPUT,
            )
            .groupBy("p")
            .transformWithStateInPandas(
                _processor(allowed_ms, config.name(job)),
                OUTPUT_DDL,
                "Append",
                "EventTime",
                eventTimeColumnName="ts",
            )
        )
        bucket = F.pmod(
            F.xxhash64(F.coalesce(F.col("d_query"), F.col("key"), F.lit(""))), F.lit(TOTALS_BUCKETS)
        )
        return (
            steps.withColumn("bucket", bucket)
            .groupBy("bucket")
            .transformWithStateInPandas(_totals_processor(), FOLDED_DDL, "Append", "None")
        )

    return fold


def ctr_view(config: AnalyticsConfig) -> View:
    job = "ctr"
    layouts: list[Layout] = [
        Collection(SEARCHES),
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
    ]
    store, also = stores(config, job, layouts, QUERIES)

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
        decode=decoder(config.kinds(), config.registry_url),
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
