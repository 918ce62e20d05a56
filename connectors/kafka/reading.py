"""Read a topic whole, from its start to its true end (assigned partitions, no group)."""

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

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
    props: dict[str, ClientValue] = {"group.id": "tributary-reader", "enable.auto.commit": False}
    consumer = Consumer(kafka.client_properties(**props))
    out: list[Record] = []
    try:
        for p in range(partitions):
            low, high = marks[(topic, p)]
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            got = 0
            deadline = time.monotonic() + timeout
            # Ask for no more than what is still expected: consume() waits out its timeout
            # when fewer messages remain.
            while got < high - low and time.monotonic() < deadline:
                for msg in consumer.consume(min(high - low - got, 10_000), timeout=1):
                    err = msg.error()
                    if err is not None:
                        raise KafkaError(f"reading {topic}[{p}]: {err.str()}", err.name())
                    got += 1
                    out.append(
                        Record(
                            topic,
                            p,
                            msg.offset() or 0,
                            msg.key(),
                            msg.value(),
                            _headers(msg.headers()),
                        )
                    )
            if got < high - low:
                raise KafkaError(f"{topic}[{p}]: read {got} of {high - low} records in {timeout}s")
    finally:
        consumer.close()
    return out


def _headers(
    raw: dict[str, str | bytes | None] | list[tuple[str, str | bytes | None]] | None,
) -> dict[str, bytes | None]:
    items = list(raw.items()) if isinstance(raw, dict) else (raw or [])
    return {k: (v.encode() if isinstance(v, str) else v) for k, v in items}
