"""Test helpers: read a topic whole (the connectors' reader) and wait for a condition."""

from connectors.kafka import KafkaConfig
from connectors.kafka.reading import Record
from connectors.kafka.reading import read_topic as _read_topic
from infra.polling import poll_until as wait_until

__all__ = ["Record", "read_topic", "wait_until"]


def read_topic(kafka: KafkaConfig, topic: str, partitions: int | None = None) -> list[Record]:
    """Every record of the topic now (``partitions`` is accepted for old call sites)."""
    return _read_topic(kafka, topic)
