"""Read a topic whole, from its start to its true end (assigned partitions, no group).

A partition's offsets are not one record each: compaction removes records, and transaction
markers take an offset of their own. So a partition is read until the consumer's position
reaches the true end (or the end-of-partition signal says there is nothing more below it),
never by counting records.
"""

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from connectors.errors import KafkaError
from connectors.kafka.admin import TopicAdmin
from connectors.kafka.config import ClientValue, KafkaConfig
from connectors.kafka.offsets import probe_consumer, true_watermarks


@dataclass(frozen=True)
class Record:
    """A record as read: where it is, its key, value and headers."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes | None]


def read_topic(kafka: KafkaConfig, topic: str, timeout: float = 60.0) -> list[Record]:
    """Every record of the topic now, partition by partition in offset order."""
    partitions = TopicAdmin(kafka).partition_count(topic) or 0
    probe = probe_consumer(kafka)
    try:
        marks = true_watermarks(probe, [(topic, p) for p in range(partitions)])
    finally:
        probe.close()
    props: dict[str, ClientValue] = {
        "group.id": "tributary-reader",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 10,
    }
    consumer = Consumer(kafka.client_properties(**props))
    out: list[Record] = []
    try:
        for p in range(partitions):
            low, high = marks[(topic, p)]
            if high > low:
                out.extend(_read_partition(consumer, topic, p, low, high, timeout))
    finally:
        consumer.close()
    return out


def _read_partition(
    consumer: Consumer, topic: str, partition: int, low: int, high: int, timeout: float
) -> list[Record]:
    consumer.assign([TopicPartition(topic, partition, low)])
    out: list[Record] = []
    position = low
    deadline = time.monotonic() + timeout
    while position < high:
        if time.monotonic() > deadline:
            raise KafkaError(
                f"{topic}[{partition}]: read up to offset {position} of {high} in {timeout:.0f}s"
            )
        # Ask for no more than what may still be there: consume() waits out its timeout when
        # fewer messages remain.
        for msg in consumer.consume(min(high - position, 10_000), timeout=1):
            err = msg.error()
            if err is not None:
                if err.code() == RdKafkaError._PARTITION_EOF:
                    # At the log's end: offsets still below it hold no record (compacted
                    # away, transaction markers).
                    if (msg.offset() or 0) >= high:
                        position = high
                    continue
                raise KafkaError(f"reading {topic}[{partition}]: {err.str()}", err.name())
            offset = msg.offset() or 0
            if offset >= high:
                position = high
                break
            position = offset + 1
            out.append(
                Record(topic, partition, offset, msg.key(), msg.value(), _headers(msg.headers()))
            )
    consumer.unassign()
    return out


def _headers(
    raw: dict[str, str | bytes | None] | list[tuple[str, str | bytes | None]] | None,
) -> dict[str, bytes | None]:
    items = list(raw.items()) if isinstance(raw, dict) else (raw or [])
    return {k: (v.encode() if isinstance(v, str) else v) for k, v in items}
