"""Read a topic whole, up to its true end, for assertions."""

import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

from connectors.kafka import KafkaConfig
from connectors.kafka.offsets import probe_consumer, true_watermarks


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes | None]


def read_topic(kafka: KafkaConfig, topic: str, partitions: int = 1) -> list[Record]:
    """Every record of the topic now, in partition then offset order."""
    probe = probe_consumer(kafka)
    try:
        marks = true_watermarks(probe, [(topic, p) for p in range(partitions)])
    finally:
        probe.close()
    out: list[Record] = []
    consumer = Consumer(
        kafka.client_properties(
            **{"group.id": "tributary-test-reader", "enable.auto.commit": False}
        )
    )
    try:
        for p in range(partitions):
            low, high = marks[(topic, p)]
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            got = 0
            deadline = time.monotonic() + 60
            while got < high - low and time.monotonic() < deadline:
                for msg in consumer.consume(min(high - low - got, 10_000), timeout=2):
                    err = msg.error()
                    assert err is None, err
                    got += 1
                    out.append(
                        Record(p, msg.offset(), msg.key(), msg.value(), dict(msg.headers() or []))
                    )
            assert got == high - low, f"{topic}[{p}]: read {got} of {high - low}"
    finally:
        consumer.close()
    return out


def wait_until(check: Callable[[], bool], timeout: float, what: str, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
