"""Producing to Kafka the one way Tributary does: an idempotent producer (no duplicate and no
reordering on a retry; ``acks=all`` follows from it), keys optionally placed where Java
clients place them, and a batch confirmed only once every record of it was acknowledged.

    deliveries = Deliveries()
    producer.produce(topic, key=k, value=v, on_delivery=deliveries)
    failure = deliveries.confirm(producer, timeout=30)  # None: every record acknowledged
"""

from collections.abc import Mapping
from typing import Any

from confluent_kafka import Producer

from connectors.kafka.config import ClientValue, KafkaConfig

__all__ = [
    "IDEMPOTENT",
    "JAVA_PLACEMENT",
    "ORDERED",
    "Deliveries",
    "idempotent_producer",
    "ordered_producer",
]

#: What makes a producer idempotent (librdkafka then enforces acks=all and in-order retries).
IDEMPOTENT: dict[str, ClientValue] = {"enable.idempotence": True}
#: Keys land in the partition Java clients choose (murmur2), not librdkafka's default (crc32).
JAVA_PLACEMENT: dict[str, ClientValue] = {"partitioner": "murmur2_random"}


#: A producer without a producer id that still never reorders a retried record: every replica
#: acknowledges, one request in flight per connection. A retry may write a record twice.
ORDERED: dict[str, ClientValue] = {"acks": "all", "max.in.flight.requests.per.connection": 1}


def idempotent_producer(
    kafka: KafkaConfig,
    overrides: Mapping[str, ClientValue] | None = None,
    *,
    java_placement: bool = False,
) -> Producer:
    """An idempotent producer on ``kafka`` (``java_placement``: keys placed as Java clients
    place them); ``overrides`` add or change librdkafka properties (``linger.ms`` …)."""
    props = {**IDEMPOTENT, **(JAVA_PLACEMENT if java_placement else {}), **(overrides or {})}
    return Producer(kafka.client_properties(**props))


def ordered_producer(
    kafka: KafkaConfig, overrides: Mapping[str, ClientValue] | None = None
) -> Producer:
    """A producer for a short-lived process that sends a record or two to a consumer that
    deduplicates them (the command processor answers a command id once): an idempotent
    producer's first send waits for its producer id, which librdkafka asks again only after a
    500 ms timer when its bootstrap connection gives way to the broker's advertised one (every
    time, on the local broker) - half a second of `tributary command`. Same order and
    acknowledgements (:data:`ORDERED`); a retry may deliver a record twice."""
    return Producer(kafka.client_properties(**{**ORDERED, **(overrides or {})}))


class Deliveries:
    """The delivery reports of a batch: pass it as ``on_delivery`` to each ``produce`` of the
    batch, then :meth:`confirm` it."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.acknowledged = 0
        #: per (topic, partition), the offset after the last acknowledged record
        self.ends: dict[tuple[str, int], int] = {}

    def __call__(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acknowledged += 1
            offset = msg.offset() if msg is not None else None
            if offset is not None and offset >= 0:
                ref = (msg.topic() or "", msg.partition() or 0)
                self.ends[ref] = max(self.ends.get(ref, 0), offset + 1)
        else:
            self.failures.append(err.str() if hasattr(err, "str") else str(err))

    def confirm(self, producer: Producer, timeout: float) -> str | None:
        """Flush ``producer``; None when every record of the batch was acknowledged, else why
        not (the first failure, or the timeout) for the caller's own error."""
        left = producer.flush(timeout)
        if self.failures:
            return self.failures[0]
        if left:
            return f"{left} records not acknowledged within {timeout:.0f} s"
        return None
