"""True partition end offsets.

``ListOffsets(latest)`` is what ``get_watermark_offsets`` asks, and some Kafka-protocol
brokers (Tansu among them) answer it with the base offset of the last stored batch + 1
instead of the end of the log. The high watermark carried by a *fetch* response is
right everywhere, so a reader that needs the true end fetches from the reported end
minus one and keeps the larger of the two values. On Apache Kafka both agree and this
costs one small fetch per non-empty partition.
"""

import time
from collections.abc import Iterable

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from connectors.errors import KafkaError
from connectors.kafka.config import ClientValue, KafkaConfig

Watermarks = dict[tuple[str, int], tuple[int, int]]


def probe_consumer(config: KafkaConfig) -> Consumer:
    """A group-less consumer for assigned reads (no JoinGroup, no commits)."""
    overrides: dict[str, ClientValue] = {
        "group.id": f"{config.client_id}-probe",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 10,  # Tansu holds a fetch this long even when data is there
    }
    return Consumer(config.client_properties(**overrides))


def true_watermarks(
    consumer: Consumer, partitions: Iterable[tuple[str, int]], timeout: float = 10.0
) -> Watermarks:
    """(low, high) per partition with the high watermark taken from a fetch response."""
    marks: Watermarks = {}
    probe: list[TopicPartition] = []
    for topic, partition in partitions:
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout
            )
        except Exception as exc:  # confluent_kafka.KafkaException
            raise KafkaError(f"cannot list offsets of {topic}[{partition}]: {exc}") from exc
        marks[(topic, partition)] = (low, high)
        if high > low:
            probe.append(TopicPartition(topic, partition, high - 1))
    if not probe:
        return marks
    consumer.assign(probe)
    pending = {(tp.topic, tp.partition) for tp in probe}
    deadline = time.monotonic() + timeout
    try:
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(len(pending), timeout=0.5):
                err = msg.error()
                if err is not None and err.code() != RdKafkaError._PARTITION_EOF:
                    raise KafkaError(f"fetch for end offsets failed: {err.str()}", err.name())
                pending.discard((msg.topic(), msg.partition()))
    finally:
        for tp in probe:
            key = (tp.topic, tp.partition)
            low, high = marks[key]
            _, fetched_high = consumer.get_watermark_offsets(tp, cached=True)
            if fetched_high is not None and fetched_high >= 0:
                marks[key] = (low, max(high, fetched_high))
        consumer.unassign()
    return marks
