"""Publishing changes to Kafka: at-least-once, never skipping a record.

Each batch is produced with an idempotent producer and flushed; the call returns only when
the broker acknowledged every record of the batch, so the engine commits the source offset
(the LSN) only for changes Kafka holds. Any delivery error raises :class:`PublishError`.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import Message, Producer

from cdc.errors import PublishError
from connectors.kafka.admin import TopicAdmin
from connectors.kafka.config import ClientValue, KafkaConfig
from connectors.kafka.topics import TopicSpec, state_topic

LSN_HEADER = "lsn"
TXID_HEADER = "txId"

HeaderList = list[tuple[str, str | bytes | None]]


@dataclass(frozen=True)
class OutgoingChange:
    """One record for Kafka: destination topic, key, value (None = tombstone) and headers."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: "HeaderList"


TopicSpecFor = Callable[[str], TopicSpec]


class ChangePublisher:
    """Produces batches of changes and waits for every acknowledgement."""

    def __init__(
        self,
        kafka: KafkaConfig,
        topic_partitions: int = 1,
        spec_for: TopicSpecFor | None = None,
        flush_timeout_s: float = 120.0,
    ) -> None:
        overrides: dict[str, ClientValue] = {
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "batch.num.messages": 10000,
            "compression.type": "lz4",
            # The Java client's partitioner: the same key lands on the same partition
            # whichever client produced it.
            "partitioner": "murmur2_random",
            "queue.buffering.max.messages": 500_000,
        }
        self._producer = Producer(kafka.client_properties(**overrides))
        self._admin = TopicAdmin(kafka)
        self._spec_for = spec_for or (lambda topic: state_topic(topic, topic_partitions))
        self._ready_topics: set[str] = set()
        self._flush_timeout_s = flush_timeout_s
        self._errors: list[str] = []

    def _on_delivery(self, err: RdKafkaError | None, msg: Message) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}: {err.str()} [{err.name()}]")

    def ensure_topic(self, topic: str) -> None:
        if topic not in self._ready_topics:
            try:
                self._admin.ensure(self._spec_for(topic))
            except Exception as exc:
                raise PublishError(f"cannot prepare topic {topic}: {exc}") from exc
            self._ready_topics.add(topic)

    def publish(self, changes: Iterable[OutgoingChange]) -> int:
        """Produce every change and block until all are acknowledged. Returns the count."""
        count = 0
        for change in changes:
            self.ensure_topic(change.topic)
            while True:
                try:
                    self._producer.produce(
                        change.topic,
                        key=change.key,
                        value=change.value,
                        headers=change.headers,
                        on_delivery=self._on_delivery,
                    )
                    break
                except BufferError:
                    self._producer.poll(0.05)  # local queue full: let deliveries drain
            count += 1
            if count % 1000 == 0:
                self._producer.poll(0)
        remaining = self._producer.flush(self._flush_timeout_s)
        if remaining:
            raise PublishError(
                f"{remaining} change(s) not acknowledged by Kafka within "
                f"{self._flush_timeout_s:.0f}s; the connector stops without committing them"
            )
        if self._errors:
            errors, self._errors = self._errors, []
            raise PublishError(
                f"Kafka rejected {len(errors)} change(s), first: {errors[0]}; "
                "the connector stops without committing them"
            )
        return count

    def close(self) -> None:
        self._producer.flush(self._flush_timeout_s)
