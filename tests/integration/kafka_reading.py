"""Test helpers: read a topic whole (the connectors' reader) and wait for a condition."""

import time
from collections.abc import Callable

from connectors.kafka import KafkaConfig
from connectors.kafka.reading import Record
from connectors.kafka.reading import read_topic as _read_topic

__all__ = ["Record", "read_topic", "wait_until"]


def read_topic(kafka: KafkaConfig, topic: str, partitions: int | None = None) -> list[Record]:
    """Every record of the topic now (``partitions`` is accepted for old call sites)."""
    return _read_topic(kafka, topic)


def wait_until(check: Callable[[], bool], timeout: float, what: str, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
