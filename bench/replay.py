"""Benchmark: rebuild the mirror of a CDC topic from offset zero (not a test).

    .venv/bin/python bench/replay.py [--sizes 200000,1000000] [--keys-per 10] [--partitions 4]
    .venv/bin/python bench/replay.py --views social [--events 200000] [--users 2000]

Starts its own local stack (PostgreSQL, SeaweedFS + Tansu, Redis) on free ports and, for each
size, fills ``cdc.public.bench<N>`` with Debezium-format changes (inserts, updates, deletes
with tombstones over N/keys-per keys), then measures in the same run:

  plain     a plain confluent-kafka read of the whole topic (assigned partitions): the baseline
  decode    the same read, each record decoded by ``json.loads`` (what a Python consumer pays)
  fold      the project's reader + the mirror's columnar fold in this process, no Spark
  source    the Spark Kafka source alone, into Spark's noop sink (trigger availableNow)
  replay    ``replay`` of the mirror view: source + fold on the executors + PostgreSQL + swap

and prints records/s, the ratio to the plain read, and where the replay's time goes: reading and
folding (Spark jobs, executors), writing (the store's transactions), the swap, and the rest
(query start, planning and Spark's overhead per batch).

``--views social`` instead fills ``cdc.public.users``, ``events.post`` and ``events.follows``
with a social workload in CDC's wire formats (``bench/social_workload.py`` says which mix) and,
for each of the search index (tantivy), the profile cache (Redis) and the home timeline
(PostgreSQL) of ``examples.social.views``, measures a plain read of the view's topics and the
view's ``replay``, then checks the rebuilt view against the workload's model of the source of
truth (so a broken replay cannot pass for a fast one).
"""

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.social_workload import BenchFeed, expected_profiles, fill_social
from bench.spark_reads import plain_read, plain_read_topics, source_alone
from bench.stopping import stop_cleanly_on_sigterm
from connectors.kafka import KafkaConfig, TopicAdmin, state_topic
from connectors.kafka.config import ClientValue
from connectors.postgres import make_engine
from event_store import create_schema
from event_store.personal import PgKeys
from examples.social.views import social_views
from examples.social.views.reference import expected_search, timelines_by_sql
from infra.stack import LocalStack
from infra.stack.isolated import isolated_settings
from projections.mirror import fold_changes
from projections.view import View
from spark_streaming.kafka_offsets import OffsetRange
from spark_streaming.kafka_options import KafkaSourceOptions
from spark_streaming.kafka_reader import read_range
from spark_streaming.replay import replay
from spark_streaming.session import spark_session
from views.catalog import ViewsConfig, configured_views


def envelope(op: str, before: object, after: object, lsn: int, table: str) -> bytes:
    """A Debezium envelope as the connector writes it (schemas disabled)."""
    source = {
        "version": "3.6.3.Final",
        "connector": "postgresql",
        "name": "cdc",
        "lsn": lsn,
        "txId": lsn // 3,
        "ts_ms": 0,
        "db": "tributary",
        "schema": "public",
        "table": table,
        "snapshot": "false",
    }
    value = {"before": before, "after": after, "op": op, "source": source, "ts_ms": 0}
    return json.dumps(value).encode()


def create_source(dsn: str, table: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS public.{table}"
            " (id bigint PRIMARY KEY, name text, qty integer, note text)"
        )


def fill(kafka: KafkaConfig, topic: str, records: int, keys: int, partitions: int) -> int:
    """Inserts, updates and deletes (with tombstones) of ``keys`` rows, ``records`` in all;
    returns the rows alive at the end."""
    TopicAdmin(kafka).ensure(state_topic(topic, partitions))
    bulk: dict[str, ClientValue] = {
        "enable.idempotence": True,
        "linger.ms": 20,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000,
        "partitioner": "murmur2_random",
    }
    producer = Producer(kafka.client_properties(**bulk))
    table = topic.rsplit(".", 1)[1]
    rng = random.Random(1)
    live: dict[int, int] = {}
    lsn, sent = 10_000, 0
    while sent < records:
        row_id = rng.randrange(keys)
        lsn += 16
        key = json.dumps({"id": row_id}).encode()
        if row_id in live and rng.random() < 0.1 and sent + 2 <= records:
            before = {"id": row_id, "name": f"n{live[row_id]}", "qty": live[row_id]}
            producer.produce(topic, key=key, value=envelope("d", before, None, lsn, table))
            producer.produce(topic, key=key, value=None, headers=[("lsn", str(lsn).encode())])
            del live[row_id]
            sent += 2
        else:
            op = "u" if row_id in live else "c"
            live[row_id] = rng.randrange(10_000)
            after = {
                "id": row_id,
                "name": f"n{live[row_id]}",
                "qty": live[row_id],
                "note": "x" * 60,
            }
            producer.produce(topic, key=key, value=envelope(op, None, after, lsn, table))
            sent += 1
        producer.poll(0)
    assert producer.flush(120) == 0
    return len(live)


def read_and_fold(kafka: KafkaConfig, topic: str, ends: dict[int, int]) -> tuple[float, float]:
    """Seconds for the project's reader alone, and for reader + columnar fold (one process)."""
    options = KafkaSourceOptions.parse(
        {"kafka.bootstrap.servers": kafka.bootstrap_servers, "subscribe": topic}
    )
    started = time.perf_counter()
    batches = [b for p, e in ends.items() for b in read_range(options, OffsetRange(topic, p, 0, e))]
    read_s = time.perf_counter() - started
    by_partition: dict[int, list[Any]] = {}
    for batch in batches:
        by_partition.setdefault(batch.column("partition")[0].as_py(), []).append(batch)
    started = time.perf_counter()
    for part in by_partition.values():
        for _ in fold_changes(part):
            pass
    return read_s, read_s + time.perf_counter() - started


def mirror_count(dsn: str, schema: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM {schema}.public_{table}").fetchone()
    return int(row[0]) if row else -1


def run_size(
    spark: Any, settings: Any, work: Path, size: int, keys_per: int, partitions: int, batch: int
) -> None:
    kafka = settings.kafka("bench")
    dsn = settings.postgres().dsn
    table = f"bench{size}"
    topic = f"cdc.public.{table}"
    create_source(dsn, table)
    started = time.perf_counter()
    live = fill(kafka, topic, size, max(1, size // keys_per), partitions)
    print(
        f"\n== {size:,} records, {size // keys_per:,} keys, {partitions} partitions"
        f" (filled in {time.perf_counter() - started:.1f}s)"
    )
    ends = TopicAdmin(kafka).end_offsets(topic)
    total = sum(ends.values())
    assert total == size, (total, ends)

    config = ViewsConfig(
        kafka=kafka,
        postgres_dsn=dsn,
        views_schema="views",
        checkpoint_root=work / f"checkpoints-{size}",
        mirror_tables=(f"public.{table}",),
        replay_max_offsets_per_trigger=batch,
    )
    source_alone(spark, kafka, topic, work / f"warm-{size}", batch)  # JVM and workers warm
    plain_s = plain_read(kafka, topic, ends)
    decode_s = plain_read(kafka, topic, ends, decode=True)
    reader_s, fold_s = read_and_fold(kafka, topic, ends)
    source_s, source_busy, source_batches = source_alone(
        spark, kafka, topic, work / f"source-{size}", batch
    )
    [view] = configured_views(config).values()
    started = time.perf_counter()
    result = replay(spark, view, kafka, config.job_options(replay=True))
    replay_s = time.perf_counter() - started
    assert result.records == total
    assert mirror_count(dsn, "views", table) == live
    plain_s = min(plain_s, plain_read(kafka, topic, ends))

    rows = [
        ("plain confluent-kafka read", plain_s),
        ("plain read + json.loads", decode_s),
        ("project reader (no Spark)", reader_s),
        ("reader + columnar fold (no Spark)", fold_s),
        (f"Spark source -> noop ({source_batches} batches)", source_s),
        (f"replay of the mirror ({result.batches} batches)", replay_s),
    ]
    print(f"{'run':<44}{'seconds':>8}{'records/s':>12}{'vs plain':>10}")
    for name, seconds in rows:
        print(f"{name:<44}{seconds:>8.2f}{total / seconds:>12,.0f}{plain_s / seconds:>9.2f}x")
    other = replay_s - result.fold_s - result.write_s - result.swap_s
    print(
        f"replay time: read+fold {result.fold_s:.2f}s, write {result.write_s:.2f}s,"
        f" swap {result.swap_s:.2f}s, rest (query start, planning, Spark per batch) {other:.2f}s"
        f" = {other / max(1, result.batches):.2f}s per batch; source in batches"
        f" {total / source_busy:,.0f}/s ({source_s - source_busy:.2f}s outside batches);"
        f" {live:,} rows mirrored"
    )


def timeline_rows(dsn: str, schema: str) -> dict[int, list[int]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            f"SELECT user_id, post_id FROM {schema}.timeline"
            " ORDER BY user_id, created_at DESC, post_id DESC"
        ).fetchall()
    out: dict[int, list[int]] = {}
    for user_id, post_id in rows:
        out.setdefault(int(user_id), []).append(int(post_id))
    return out


def check_social(view: View, feed: BenchFeed, dsn: str, schema: str) -> str:
    """Compare the replayed view with the workload's model; returns what it holds."""
    state = feed.state
    if view.name == "profile":
        held: Any = {int(e.key): dict(e.fields) for e in view.store.scan("profiles")}
        assert held == expected_profiles(state), f"profile: {len(held)} profiles differ"
        return f"{len(held):,} profiles == users"
    if view.name == "search":
        keep = ("text", "hashtags", "author_handle", "author_name")
        held = {int(e.key): {k: e.fields.get(k) for k in keep} for e in view.store.scan("posts")}
        assert held == expected_search(state), f"search: {len(held)} documents differ"
        return f"{len(held):,} documents == live posts"
    held = timeline_rows(dsn, schema)
    assert held == timelines_by_sql(dsn, state.posts.values(), state.follows), "timeline differs"
    return f"{sum(len(v) for v in held.values()):,} rows, {len(held):,} users == SQL join"


def run_social(
    spark: Any, settings: Any, work: Path, events: int, users: int, partitions: int, batch: int
) -> None:
    kafka = settings.kafka("bench")
    dsn = settings.postgres().dsn
    started = time.perf_counter()
    engine = make_engine(settings.postgres())
    with engine.begin() as conn:  # the subject keys the views decrypt the posts' text with
        create_schema(conn, "event_store")
    engine.dispose()
    key_conn = psycopg.connect(dsn, autocommit=True)
    feed = BenchFeed(
        kafka,
        "cdc",
        partitions=partitions,
        registry_url=settings.registry_url,
        keys=PgKeys(key_conn, "event_store"),
    )
    done = fill_social(feed, events, users)
    key_conn.close()
    state = feed.state
    print(
        f"\n== social views: {feed.records:,} records, {partitions} partitions"
        f" (filled in {time.perf_counter() - started:.1f}s)\n"
        + ", ".join(f"{kind} {n:,}" for kind, n in done.items())
        + f"; at the end {len(state.users):,} users, {len(state.posts):,} live posts,"
        f" {len(state.follows):,} follow edges"
    )
    config = ViewsConfig(
        kafka=kafka,
        postgres_dsn=dsn,
        views_schema="views",
        checkpoint_root=work / "checkpoints-social",
        redis_url=settings.cache_url,
        index_root=work / "indexes",
        view_factories=("examples.social.views:social_views",),
        replay_max_offsets_per_trigger=batch,
        schema_registry_url=settings.registry_url,
    )
    views = social_views(config)
    admin = TopicAdmin(kafka)
    source_alone(spark, kafka, "events.post", work / "warm-social", batch)  # JVM and workers warm
    results = []
    for view in views:
        ends = {(t, p): e for t in view.topics for p, e in admin.end_offsets(t).items()}
        total = sum(ends.values())
        plain_s = min(plain_read_topics(kafka, ends) for _ in range(2))
        started = time.perf_counter()
        result = replay(spark, view, kafka, config.job_options(replay=True))
        replay_s = time.perf_counter() - started
        assert result.records == total, (view.name, result.records, total)
        started = time.perf_counter()
        held = check_social(view, feed, dsn, config.views_schema)
        check_s = time.perf_counter() - started
        results.append((view, total, plain_s, replay_s, result, held, check_s))
        print(f"  {view.name}: replayed in {replay_s:.1f}s, checked: {held}", flush=True)

    print(f"{'view':<9}{'records':>9}{'plain s':>9}{'plain/s':>11}{'replay s':>10}{'events/s':>10}")
    for view, total, plain_s, replay_s, result, _, _ in results:
        print(
            f"{view.name:<9}{total:>9,}{plain_s:>9.2f}{total / plain_s:>11,.0f}{replay_s:>10.2f}"
            f"{total / replay_s:>10,.0f}  {plain_s / replay_s:.3f}x plain"
            f" ({result.batches} batches)"
        )
    for view, _, _, replay_s, result, held, check_s in results:
        other = replay_s - result.fold_s - result.write_s - result.swap_s
        print(
            f"{view.name}: topics {', '.join(view.topics)}; read+fold {result.fold_s:.2f}s,"
            f" write {result.write_s:.2f}s, swap {result.swap_s:.2f}s, rest {other:.2f}s;"
            f" checked ({check_s:.1f}s): {held}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="200000,1000000")
    parser.add_argument("--keys-per", type=int, default=10, help="records per key")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500_000, help="maxOffsetsPerTrigger")
    parser.add_argument(
        "--views",
        choices=("mirror", "social"),
        default="mirror",
        help="mirror: the mirror of one table per size; social: search, profile and timeline",
    )
    parser.add_argument("--events", type=int, default=200_000, help="social: records in all")
    parser.add_argument("--users", type=int, default=2_000, help="social: users")
    args = parser.parse_args()

    settings = isolated_settings("tributary-bench-")
    stack = LocalStack(settings)
    stack.up()
    work = Path(tempfile.mkdtemp(prefix="tributary-bench-work-"))
    try:
        spark = spark_session(
            settings.spark_master,
            "tributary-bench",
            driver_memory="2g",
            local_dir=str(work / "spark"),
        )
        if args.views == "social":
            run_social(spark, settings, work, args.events, args.users, args.partitions, args.batch)
        else:
            for size in (int(s) for s in args.sizes.split(",")):
                run_size(spark, settings, work, size, args.keys_per, args.partitions, args.batch)
        spark.stop()
    finally:
        stack.down()
        shutil.rmtree(settings.home.parent, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
