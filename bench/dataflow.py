"""Benchmark: where the data path's time goes, for every view and every analytics job (not a test).

    .venv/bin/python bench/dataflow.py [--events 100000] [--scale 10] [--batch 500000]
        [--only mirror,search,profile,timeline,activity,hashtags,...] [--partitions 2]

For each size (``--events``, then ``--events * --scale``, so the cost's growth shows), on a
fresh local stack (PostgreSQL, SeaweedFS + Tansu, Redis, the schema registry; free ports):

1. fills the topics in the wire formats CDC and the front end produce: a social workload of
   about ``events`` records (``cdc.public.users`` Debezium changes, ``events.post`` and
   ``events.follows`` Avro events from the outbox, likes among them; ``bench/social_workload.py``
   gives the mix) and ``events`` activity records (searches and clicks with skewed device
   clocks, late events and stragglers; ``examples.social.activity``);
2. for every view (``mirror.public.users``, ``search``, ``profile``, ``timeline``) and every
   analytics job (``activity``, ``hashtags``, ``trending``, ``sessions``, ``ctr``, ``likes``,
   ``alerts``, ``approx``): a plain confluent-kafka read of exactly the topics it reads (the
   baseline, best of two), then the view or job from offset zero to the end of its topics as
   production runs it (``ViewJob``: its stores, its ledger, RocksDB state; trigger
   availableNow, ``--batch`` offsets per micro-batch);
3. prints per view and job: records, events/s and the ratio to the plain read; the average
   micro-batch split into *source read* and *decode/fold in the read task* (summed over the
   read tasks, which run two at a time), *Spark* (the rest of the batch's Spark job: state,
   operators, the transfer of the result to the driver, as wall time), *store write* (the
   stores' atomic apply) and *Spark overhead* (planning, offsets, commits: the trigger's time
   outside foreachBatch); the share of the store write; rows out and Spark's state rows
   (peak); peak resident memory of the driver's JVM and Python and the Python workers' PSS.

The views are checked against the workload's model of the source of truth (as
``bench/replay.py --views social`` does), so a broken view cannot pass for a fast one; every
run must reach the end of its topics. All clients close before the stack stops.
"""

import argparse
import gc
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.analytics import (
    MemorySampler,
    jvm_pid,
    state_figures,
    warm_python_workers,
    workload_plan,
)
from bench.analytics import (
    fill as fill_activity,
)
from bench.replay import check_social
from bench.social_workload import BenchFeed, Picker, fill_social
from bench.spark_reads import plain_read_topics, source_alone
from bench.stopping import stop_cleanly_on_sigterm
from connectors.kafka import KafkaConfig, TopicAdmin
from examples.social.analytics import AnalyticsConfig, analytics_views
from infra.stack import LocalStack
from infra.stack.isolated import isolated_settings
from projections.time import Lateness
from projections.view import View
from spark_streaming.session import spark_session
from spark_streaming.view_job import BatchReport, ViewJob
from views.catalog import JobOptions, ViewsConfig, configured_views

USERS_TABLE = """CREATE TABLE IF NOT EXISTS public.users (
    id bigint PRIMARY KEY, handle text NOT NULL, display_name text, bio text,
    updated_at timestamptz)"""
JOB_TIMEOUT_S = 3600.0


class LikingFeed(BenchFeed):
    """The bench's social feed with likes (the ``likes`` job joins them with profiles)."""

    def like(self, post_id: int, user_id: int) -> None:
        post = self.state.posts[post_id]
        data = {
            "post_id": post_id,
            "author_id": post["author_id"],
            "user_id": user_id,
            "liked_at": self._tick(),
        }
        self._event("post", f"post-{post_id}", "PostLiked", data)


def fill_with_likes(feed: LikingFeed, records: int, users: int) -> dict[str, int]:
    """The social mix for about 80 % of the records, then likes of live posts."""
    done = dict(fill_social(feed, int(records * 0.8), users))
    posts = Picker()
    for post_id in feed.state.posts:
        posts.add(post_id)
    import random

    rng = random.Random(3)
    likes = 0
    while feed.records < records and len(posts):
        feed.like(posts.choice(rng), rng.randrange(1, users + 1))
        likes += 1
    feed.flush()
    done["like"] = likes
    return done


@dataclass
class Run:
    """One view or job from offset zero to the end of its topics."""

    name: str
    records: int
    plain_s: float
    seconds: float = 0.0
    batches: int = 0
    read_s: float = 0.0  # Kafka reads in the source's read tasks (summed over tasks)
    decode_s: float = 0.0  # decode/fold in the read tasks (summed over tasks)
    job_s: float = 0.0  # the batches' Spark jobs (wall): read tasks, operators, state, transfer
    write_s: float = 0.0  # the stores' atomic applies
    overhead_s: float = 0.0  # trigger time outside foreachBatch
    rows_out: int = 0
    state_rows_peak: int = 0
    memory: dict[str, int] = field(default_factory=dict)
    checked: str = ""

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def ratio(self) -> float:
        return self.plain_s / self.seconds if self.seconds else 0.0


def stage_times(path: Path, since: float) -> tuple[float, float]:
    """Kafka read and decode/fold seconds the read tasks appended after ``since``."""
    read = fold = 0.0
    if path.exists():
        for line in path.read_text().splitlines():
            item = json.loads(line)
            if item["at"] >= since:
                read += item["read_s"]
                fold += item["fold_s"]
    return read, fold


def run_view(spark: Any, view: View, kafka: KafkaConfig, work: Path, batch: int, pid: int) -> Run:
    admin = TopicAdmin(kafka)
    ends = {(t, p): e for t in view.topics for p, e in admin.end_offsets(t).items()}
    plain_s = min(plain_read_topics(kafka, ends) for _ in range(2))
    run = Run(view.name, sum(ends.values()), plain_s)
    times = work / "stage-times.jsonl"
    options = JobOptions(
        checkpoint_root=work / "checkpoints",
        max_offsets_per_trigger=batch,
        extra_source_options={"tributary.stageTimes": str(times)},
    )
    reports: list[BatchReport] = []
    began_at = time.time()
    with MemorySampler(pid) as memory:
        started = time.perf_counter()
        job = ViewJob(spark, view, kafka, options, on_batch=reports.append)
        try:
            query = job.start(available_now=True)
            try:
                if not query.awaitTermination(JOB_TIMEOUT_S):
                    raise TimeoutError(f"{view.name} did not finish in {JOB_TIMEOUT_S:g} s")
            finally:
                if query.isActive:
                    query.stop()
            run.seconds = time.perf_counter() - started
            if query.exception() is not None:
                raise RuntimeError(f"{view.name}: {query.exception()}")
            progress = list(query.recentProgress)
        finally:
            job.close()
    reached = reports[-1].offsets if reports else {}
    for (topic, partition), end in ends.items():
        assert reached.get(topic, {}).get(str(partition), 0) >= end, (view.name, reached, ends)
    run.batches = len(reports)
    run.read_s, run.decode_s = stage_times(times, began_at)
    run.job_s = sum(r.fold_s for r in reports)
    run.write_s = sum(r.write_s for r in reports)
    trigger = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
    add_batch = sum(p["durationMs"].get("addBatch", 0) for p in progress) / 1000
    run.overhead_s = max(0.0, trigger - add_batch)
    run.rows_out = sum(r.folded for r in reports)
    run.state_rows_peak = state_figures(progress)[1]
    run.memory = dict(memory.peaks)
    return run


def mb(kb: float) -> str:
    return f"{kb / 1024:,.0f}"


def print_runs(title: str, runs: list[Run]) -> None:
    print(f"\n{title}")
    print(
        f"{'view / job':<22}{'records':>10}{'plain/s':>11}{'events/s':>10}{'vs plain':>9}"
        f"{'batches':>8} | per batch (s): {'read':>6}{'decode':>8}{'spark':>7}{'write':>7}"
        f"{'ovh':>6}{'write%':>7} | {'rows out':>9}{'state pk':>9} | MB: {'JVM':>6}"
        f"{'driver':>7}{'workers':>8}"
    )
    for r in runs:
        n = max(1, r.batches)
        busy = r.job_s + r.write_s + r.overhead_s
        print(
            f"{r.name:<22}{r.records:>10,}{r.records / r.plain_s:>11,.0f}{r.rate:>10,.0f}"
            f"{r.ratio:>8.3f}x{r.batches:>8} | {'':>15}{r.read_s / n:>6.2f}{r.decode_s / n:>8.2f}"
            f"{max(0.0, r.job_s) / n:>7.2f}{r.write_s / n:>7.2f}{r.overhead_s / n:>6.2f}"
            f"{100 * r.write_s / max(busy, 1e-9):>6.0f}% | {r.rows_out:>9,}"
            f"{r.state_rows_peak:>9,} | {'':>4}{mb(r.memory.get('jvm', 0)):>6}"
            f"{mb(r.memory.get('driver', 0)):>7}{mb(r.memory.get('workers', 0)):>8}"
        )
    for r in runs:
        if r.checked:
            print(f"  {r.name}: {r.checked}")


def run_size(
    spark: Any, events: int, users: int, args: argparse.Namespace, only: set[str] | None
) -> list[Run]:
    settings = isolated_settings("tributary-bench-")
    stack = LocalStack(settings)
    work = Path(tempfile.mkdtemp(prefix="tributary-bench-work-"))
    runs: list[Run] = []
    views: list[View] = []
    try:
        stack.up()
        kafka = settings.kafka("bench")
        dsn = settings.postgres().dsn
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(USERS_TABLE)
        from connectors.postgres import make_engine
        from event_store import create_schema
        from event_store.personal import PgKeys

        engine = make_engine(settings.postgres())
        with engine.begin() as conn:  # the subject keys the views decrypt posts' text with
            create_schema(conn, "event_store")
        engine.dispose()
        started = time.perf_counter()
        key_conn = psycopg.connect(dsn, autocommit=True)
        feed = LikingFeed(
            kafka,
            "cdc",
            partitions=args.partitions,
            registry_url=settings.registry_url,
            keys=PgKeys(key_conn, "event_store"),
        )
        done = fill_with_likes(feed, events, users)
        key_conn.close()
        lateness = Lateness.of_seconds(settings.allowed_lateness_s, settings.lateness_slack_s)
        plan = workload_plan(events, 24.0, lateness.allowed_ms)
        sent, _, _ = fill_activity(kafka, "activity", plan, args.partitions)
        print(
            f"\n== {feed.records:,} social records ("
            + ", ".join(f"{k} {n:,}" for k, n in sorted(done.items()))
            + f") and {sent:,} activity events, {args.partitions} partitions; filled in"
            f" {time.perf_counter() - started:.0f}s",
            flush=True,
        )
        config = ViewsConfig(
            kafka=kafka,
            postgres_dsn=dsn,
            views_schema="views",
            checkpoint_root=work / "checkpoints",
            redis_url=settings.cache_url,
            index_root=work / "indexes",
            view_factories=("examples.social.views:social_views",),
            mirror_tables=("public.users",),
            replay_max_offsets_per_trigger=args.batch,
            schema_registry_url=settings.registry_url,
        )
        views = list(configured_views(config).values())
        views += analytics_views(
            AnalyticsConfig(
                kafka=kafka,
                dsn=dsn,
                schema="views",
                lateness=lateness,
                registry_url=settings.registry_url,
            )
        )
        warm = work / "warm"
        source_alone(spark, kafka, "activity", warm, args.batch)  # the JVM warm
        warm_python_workers(spark)
        pid = jvm_pid(spark)
        for view in views:
            if only is not None and view.name not in only:
                continue
            run = run_view(spark, view, kafka, work, args.batch, pid)
            if view.name in ("search", "profile", "timeline"):
                run.checked = check_social(view, feed, dsn, config.views_schema)
            runs.append(run)
            print(
                f"   {view.name}: {run.records:,} records in {run.seconds:.1f}s"
                f" ({run.ratio:.3f}x plain)",
                flush=True,
            )
        return runs
    finally:
        for view in views:
            for store in view.stores:
                store.close()
        gc.collect()  # Kafka clients of the stores go before the broker does
        stack.down()
        shutil.rmtree(settings.home.parent, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=100_000, help="social and activity each")
    parser.add_argument("--scale", type=int, default=10, help="then this many times more")
    parser.add_argument("--users", type=int, default=2_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--batch", type=int, default=500_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--only", default="", help="comma-separated view and job names")
    args = parser.parse_args()
    only = {n for n in args.only.split(",") if n} or None
    work = Path(tempfile.mkdtemp(prefix="tributary-bench-spark-"))
    spark = spark_session(
        "local[2]", "tributary-bench-dataflow", driver_memory="2g", local_dir=str(work)
    )
    results: list[tuple[str, list[Run]]] = []
    try:
        sizes = [args.events] + ([args.events * args.scale] if args.scale > 1 else [])
        for events in sizes:
            runs = run_size(spark, events, args.users, args, only)
            results.append((f"{events:,} social records + {events:,} activity events", runs))
            print_runs(results[-1][0], runs)
    finally:
        for query in spark.streams.active:
            query.stop()
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("\n\n==== summary")
    for title, runs in results:
        print_runs(title, runs)


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
