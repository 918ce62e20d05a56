"""A view's progress where Kafka's lag tools look: the consumer group ``tributary.view.<name>``.

Spark keeps a query's offsets in its checkpoint and the view's store keeps the offsets it
applied (the truth a view resumes from); neither is visible to ``kafka-consumer-groups``, Kafka
UI or Burrow. After each batch a live view's store applied, the batch's end offsets are
committed as the view's consumer group (a standalone commit: the group has no members and never
rebalances). They are never read back: a view resumes from its store, whatever the group says.
A commit that fails is logged and retried with the next batch; it never stops the view.
"""

import logging
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from connectors.kafka import KafkaConfig
from connectors.kafka.config import ClientValue
from tributary.view_model import Offsets

log = logging.getLogger(__name__)

GROUP_PREFIX = "tributary.view."


def view_group(view: str) -> str:
    """The consumer group a view's applied offsets are committed as."""
    return GROUP_PREFIX + view


class LagCommitter:
    """Commits one view's applied offsets to its consumer group (best effort, asynchronous)."""

    def __init__(self, kafka: KafkaConfig, view: str) -> None:
        self.kafka = kafka
        self.group = view_group(view)
        self._consumer: Any = None
        self._warned = False

    def commit(self, offsets: Offsets) -> None:
        parts = [
            TopicPartition(topic, int(partition), int(offset))
            for topic, partitions in offsets.items()
            for partition, offset in partitions.items()
        ]
        if not parts:
            return
        try:
            if self._consumer is None:
                settings: dict[str, ClientValue] = {
                    "group.id": self.group,
                    "enable.auto.commit": False,
                }
                self._consumer = Consumer(self.kafka.client_properties(**settings))
            self._consumer.commit(offsets=parts, asynchronous=True)
            self._consumer.poll(0)  # serve the callbacks of earlier commits
        except Exception as exc:  # confluent_kafka.KafkaException: lag tools only
            if not self._warned:
                log.warning("view offsets not committed as group %s: %s", self.group, exc)
                self._warned = True

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()  # waits for the commits still in flight
            self._consumer = None
