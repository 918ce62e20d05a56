"""Baselines the read benchmarks share (``bench/replay.py``, ``bench/analytics.py``): a plain
confluent-kafka read of whole topics, and the Spark Kafka source alone into Spark's noop sink."""

import json
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from connectors.kafka import KafkaConfig
from connectors.kafka.config import ClientValue
from spark_streaming.stream import kafka_stream

PLAIN_CONSUMER: dict[str, ClientValue] = {"group.id": "bench-plain", "enable.auto.commit": False}


def plain_read_topics(
    kafka: KafkaConfig, ends: dict[tuple[str, int], int], decode: bool = False
) -> float:
    """Seconds for a plain assigned consumer to read every record of these partitions from
    offset 0 (asking only for what is left), optionally decoding each value with
    ``json.loads`` (what a Python consumer pays)."""
    consumer = Consumer(kafka.client_properties(**PLAIN_CONSUMER))
    started = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, 0) for topic, p in ends])
    left = sum(ends.values())
    while left > 0:
        for message in consumer.consume(min(left, 10_000), timeout=1.0):
            if message.error() is None:
                if decode:
                    value = message.value()
                    if value is not None:
                        json.loads(value)
                left -= 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def plain_read(kafka: KafkaConfig, topic: str, ends: dict[int, int], decode: bool = False) -> float:
    """:func:`plain_read_topics` of one topic (``ends``: records per partition)."""
    return plain_read_topics(kafka, {(topic, p): n for p, n in ends.items()}, decode)


def source_alone(
    spark: Any, kafka: KafkaConfig, topic: str, checkpoint: Path, batch: int
) -> tuple[float, float, int]:
    """Wall seconds, seconds inside batches, and batches, for the Spark Kafka source into noop
    from offset zero."""
    stream = kafka_stream(
        spark,
        {
            "kafka.bootstrap.servers": kafka.bootstrap_servers,
            "subscribe": topic,
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
    return wall, busy, len(query.recentProgress)
