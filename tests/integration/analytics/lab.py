"""The analytics test bench: a config with topics, job names and output topics of its own,
running jobs (several at once, one Spark session), and reading what they hold."""

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from connectors.kafka import KafkaConfig
from connectors.stores.kafka import KafkaStore
from connectors.stores.postgres import PostgresStore
from examples.social.analytics import AnalyticsConfig, analytics_views
from projections.time import Lateness
from projections.view import View
from spark_streaming.replay import ReplayResult, replay
from spark_streaming.view_job import BatchReport, ViewJob
from views.catalog import JobOptions

LATENESS = Lateness(allowed_ms=5 * 60_000, slack_ms=10 * 60_000)


def lab_config(kafka: KafkaConfig, dsn: str, unique: str, registry_url: str) -> AnalyticsConfig:
    return AnalyticsConfig(
        kafka=kafka,
        dsn=dsn,
        schema=f"views_{unique}",
        activity_topic=f"t{unique}.activity",
        posts_topic=f"t{unique}.events.post",
        follows_topic=f"t{unique}.events.follows",
        users_topic=f"t{unique}.public.users",
        subjects_topic=f"t{unique}.events.subject",
        lateness=LATENESS,
        prefix=f"t{unique}.",
        topic_prefix=f"t{unique}.analytics.",
        registry_url=registry_url,
    )


def views_by_job(config: AnalyticsConfig) -> dict[str, View]:
    return {view.name.removeprefix(config.prefix): view for view in analytics_views(config)}


@dataclass
class Run:
    view: View
    reports: list[BatchReport]
    dropped_by_watermark: int
    error: BaseException | None = None


def run_jobs(
    spark: Any,
    views: Sequence[View],
    kafka: KafkaConfig,
    options: JobOptions,
    options_of: Mapping[str, JobOptions] | None = None,
) -> dict[str, Run]:
    """Run each job until it has read everything there is now, all at once in one Spark
    session; raise the first failure. ``options_of``: a job's own options, by view name.

    The jobs are built and started one after the other: each Kafka store reads the whole
    shared ledger topic when it starts, and several of those reads at once crawl on the local
    broker. The next query starts once the last one has initialised its source: each starts a
    Python process that must connect back to the JVM within Spark's fixed 10 s, and eight
    starting at once on two busy cores missed it."""
    runs = {view.name: Run(view, [], 0) for view in views}
    started = []
    try:
        for view in views:
            own = (options_of or {}).get(view.name, options)
            job = ViewJob(spark, view, kafka, own, on_batch=runs[view.name].reports.append)
            query = job.start(available_now=True)
            started.append((job, query))
            sources_started(query)
        for job, query in started:
            run = runs[job.view.name]
            query.awaitTermination(900)
            if query.exception() is not None:
                run.error = AssertionError(f"{job.view.name}: {query.exception()}")
            run.dropped_by_watermark = sum(
                int(op.get("numRowsDroppedByWatermark", 0))
                for progress in query.recentProgress
                for op in progress.get("stateOperators", [])
            )
    finally:
        for job, query in started:
            if query.isActive:
                query.stop()
            job.close()
    for run in runs.values():
        if run.error is not None:
            raise run.error
    return runs


INITIALIZING = "Initializing sources"  # the query's status message until its sources are up


def sources_started(query: Any, timeout_s: float = 120.0) -> None:
    """Wait until ``query`` has initialised its sources (or ended, or ``timeout_s`` passed)."""
    deadline = time.monotonic() + timeout_s
    while query.isActive and time.monotonic() < deadline:
        if query.status.get("message") != INITIALIZING:
            return
        time.sleep(0.05)


def replay_jobs(
    spark: Any, views: Sequence[View], kafka: KafkaConfig, options: JobOptions
) -> dict[str, ReplayResult]:
    """Replay each job from offset zero, three at a time (each query waited on by a thread of
    its own): every query starts Python processes on the driver, and a dozen starting at once on
    two cores miss Spark's 10 s to connect back."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {view.name: pool.submit(replay, spark, view, kafka, options) for view in views}
        return {name: future.result() for name, future in futures.items()}


def held(view: View) -> dict[str, dict[str, dict[str, Any]]]:
    """Every collection of the job's PostgreSQL store: key -> fields."""
    store = view.store
    assert isinstance(store, PostgresStore)
    return {
        collection: {e.key: dict(e.fields) for e in store.scan(collection)}
        for collection in store.layouts
    }


def session_rows(view: View) -> dict[tuple[int, int], tuple[int, int, int, int]]:
    """The sessions job's rows in the reference's shape: (user, start) -> (end, events,
    searches, clicks)."""
    return {
        (f["user_id"], ms(f["session_start"])): (
            ms(f["session_end"]),
            f["events"],
            f["searches"],
            f["clicks"],
        )
        for f in held(view)["sessions"].values()
    }


def applied_counts(view: View, collection: str) -> dict[str, int]:
    return {e.key: e.applied for e in view.store.scan(collection)}


def kafka_held(view: View) -> dict[str, dict[str, dict[str, Any]]]:
    """The same from the job's Kafka store (what downstream teams read)."""
    [store] = [s for s in view.also if isinstance(s, KafkaStore)]
    return {name: {e.key: dict(e.fields) for e in store.scan(name)} for name in store.collections}


def ms(value: str) -> int:
    """A timestamp as PostgreSQL renders it (ISO text) in ms since the epoch."""
    return round(datetime.fromisoformat(value).timestamp() * 1000)


def scratch(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def committed_records(view: View, collection: str) -> list[tuple[str, bytes | None]]:
    """Every record of a collection's output topic that the Kafka store committed (below the
    ledger's bounds, outside its holes), in offset order: what a downstream reader gets."""
    from connectors.stores.kafka_ledger import RangeReader, in_ranges, read_ranges

    [store] = [s for s in view.also if isinstance(s, KafkaStore)]
    with store.lock:
        record = store.current().live()
    assert record is not None
    topic = store.topic(collection)
    ranges = {(topic, p): (0, end) for p, end in record.bounds.get(topic, {}).items()}
    reader = RangeReader(store.kafka)
    try:
        found = read_ranges(reader, ranges, 30.0, "test")
    finally:
        reader.close()
    out = []
    for (t, p), messages in sorted(found.items()):
        holes = record.holes_of(t, p)
        for msg in messages:
            if holes and in_ranges(holes, msg.offset() or 0):
                continue
            out.append(((msg.key() or b"").decode(), msg.value()))
    return out
