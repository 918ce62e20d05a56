"""Benchmark: rebuild the mirror of a 200,000-record CDC topic (not a test).

    .venv/bin/python bench/replay.py [--records N] [--keys K] [--partitions P]

Starts its own local stack (PostgreSQL, SeaweedFS + Tansu, Redis) on free ports, fills
``cdc.public.bench`` with Debezium-format changes, then in the same run measures:

  plain    a plain confluent-kafka read of the whole topic (assigned partitions)
  source   the Spark Kafka source alone, into Spark's noop sink (trigger availableNow)
  replay   ``replay`` of the mirror view: source + decode + fold + PostgreSQL upsert + swap

and prints events/s and the ratios against the plain read.
"""

import argparse
import dataclasses
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from connectors.changes import ChangeEvent
from connectors.kafka import KafkaConfig, TopicAdmin, state_topic
from connectors.kafka.config import ClientValue
from infra.stack import LocalStack
from spark_streaming.replay import replay
from spark_streaming.session import spark_session
from spark_streaming.stream import kafka_stream
from spark_streaming.views import ViewsConfig, configured_views
from tests.stackenv import isolated_settings

TOPIC = "cdc.public.bench"
PLAIN_CONSUMER: dict[str, ClientValue] = {"group.id": "bench-plain", "enable.auto.commit": False}


def _envelope(op: str, before: object, after: object, lsn: int) -> bytes:
    """A Debezium envelope as the connector writes it (schemas disabled)."""
    source = {
        "lsn": lsn,
        "txId": lsn,
        "ts_ms": 0,
        "schema": "public",
        "table": "bench",
        "snapshot": "false",
    }
    value = {"before": before, "after": after, "op": op, "source": source, "ts_ms": 0}
    return json.dumps(value).encode()


def fill(kafka: KafkaConfig, records: int, keys: int, partitions: int) -> int:
    """Inserts, updates and deletes (with tombstones) of ``keys`` rows, ``records`` in all."""
    TopicAdmin(kafka).ensure(state_topic(TOPIC, partitions))
    producer = Producer(
        kafka.client_properties(
            **{
                "enable.idempotence": True,
                "linger.ms": 20,
                "batch.size": 1_000_000,
                "queue.buffering.max.messages": 1_000_000,
            }
        )
    )
    rng = random.Random(1)
    live: dict[int, int] = {}
    lsn, sent = 10_000, 0
    while sent < records:
        row_id = rng.randrange(keys)
        lsn += 16
        key = json.dumps({"id": row_id}).encode()
        if row_id in live and rng.random() < 0.1 and sent + 2 <= records:
            before = {"id": row_id, "name": f"n{live[row_id]}", "qty": live[row_id]}
            producer.produce(TOPIC, key=key, value=_envelope("d", before, None, lsn))
            producer.produce(TOPIC, key=key, value=None, headers=[("lsn", str(lsn).encode())])
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
            producer.produce(TOPIC, key=key, value=_envelope(op, None, after, lsn))
            sent += 1
        producer.poll(0)
    assert producer.flush(60) == 0
    return len(live)


def plain_read(kafka: KafkaConfig, ends: dict[int, int]) -> float:
    """Seconds for a plain assigned consumer to read every record (asking only for what is left)."""
    consumer = Consumer(kafka.client_properties(**PLAIN_CONSUMER))
    started = time.perf_counter()
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in ends])
    left = sum(ends.values())
    while left > 0:
        for message in consumer.consume(min(left, 10_000), timeout=1.0):
            if message.error() is None:
                left -= 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def mirror_count(config: ViewsConfig) -> int:
    with psycopg.connect(config.postgres_dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM {config.views_schema}.public_bench").fetchone()
    return int(row[0]) if row else -1


def plain_read_and_decode(kafka: KafkaConfig, ends: dict[int, int]) -> float:
    """Seconds for a plain consumer that also decodes every record as the mirror does."""
    consumer = Consumer(kafka.client_properties(**PLAIN_CONSUMER))
    started = time.perf_counter()
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in ends])
    left = sum(ends.values())
    while left > 0:
        for message in consumer.consume(min(left, 10_000), timeout=1.0):
            if message.error() is None:
                headers: Any = message.headers()
                ChangeEvent.from_kafka(TOPIC, message.key(), message.value(), headers)
                left -= 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def source_alone(
    spark: object, kafka: KafkaConfig, checkpoint: Path, batch: int
) -> tuple[float, float]:
    """Seconds for the Spark source to read the topic into the noop sink (wall, in batches)."""
    stream = kafka_stream(
        spark,
        {
            "kafka.bootstrap.servers": kafka.bootstrap_servers,
            "subscribe": TOPIC,
            "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": str(batch),
        },
    )
    started = time.perf_counter()
    query = (
        stream.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    wall = time.perf_counter() - started
    busy = sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress) / 1000
    return wall, busy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch", type=int, default=100_000, help="maxOffsetsPerTrigger")
    args = parser.parse_args()

    settings = isolated_settings("tributary-bench-")
    stack = LocalStack(settings)
    stack.up()
    work = Path(tempfile.mkdtemp(prefix="tributary-bench-work-"))
    try:
        kafka = settings.kafka("bench")
        t0 = time.perf_counter()
        live_keys = fill(kafka, args.records, args.keys, args.partitions)
        print(
            f"filled {TOPIC}: {args.records} records, {args.keys} keys,"
            f" {args.partitions} partitions in {time.perf_counter() - t0:.1f}s"
        )
        ends = TopicAdmin(kafka).end_offsets(TOPIC)
        total = sum(ends.values())
        assert total == args.records, (total, ends)

        config = ViewsConfig(
            kafka=kafka,
            postgres_dsn=settings.postgres().dsn,
            views_schema="views",
            checkpoint_root=work / "checkpoints",
            mirror_tables=("public.bench",),
            max_offsets_per_trigger=args.batch,
        )
        spark = spark_session(settings.spark_master, "tributary-bench", driver_memory="1g")
        # Warm-up (JVM, Python workers) on the same topic, so the runs below are warm.
        source_alone(spark, kafka, work / "warmup", args.batch)

        plain_s = plain_read(kafka, ends)
        decode_s = plain_read_and_decode(kafka, ends)
        source_s, source_busy_s = source_alone(spark, kafka, work / "source", args.batch)
        [spec] = configured_views(config).values()
        replays = {}
        for per_partition in (True, False):
            started = time.perf_counter()
            result = replay(
                spark,
                dataclasses.replace(spec, per_partition=per_partition),
                kafka,
                config.job_options(),
            )
            replays[per_partition] = (time.perf_counter() - started, result.busy_s)
            assert result.records == total
            assert mirror_count(config) == live_keys
        plain_again_s = plain_read(kafka, ends)

        plain_best = min(plain_s, plain_again_s)
        rows = [
            ("plain confluent-kafka read", plain_best, None),
            ("plain read + decode (no Spark)", decode_s, None),
            ("source alone (noop sink)", source_s, source_busy_s),
            ("replay, fold on the driver", *replays[False]),
            ("replay, fold per partition", *replays[True]),
        ]
        print(f"\n{'run':<32}{'seconds':>8}{'events/s':>11}{'vs plain':>9}{'in batches':>12}")
        for name, seconds, busy in rows:
            in_batches = "" if busy is None else f"{total / busy:>9,.0f}/s"
            print(
                f"{name:<32}{seconds:>8.2f}{total / seconds:>11,.0f}"
                f"{plain_best / seconds:>8.2f}x{in_batches:>12}"
            )
        print(
            f"\nplain read runs {plain_s:.2f}s and {plain_again_s:.2f}s; maxOffsetsPerTrigger"
            f" {args.batch}; mirror rows {live_keys}. 'in batches' leaves out query start-up."
        )
        spark.stop()
    finally:
        stack.down()
        shutil.rmtree(settings.home.parent, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
