"""Publishing changes to Kafka: at-least-once, never skipping a record.

Each batch is produced with an idempotent producer and flushed; the call returns only when
the broker acknowledged every record of the batch, so the engine commits the source offset
(the LSN) only for changes Kafka holds. Any delivery error raises :class:`PublishError`.

Records of events (the outbox's, which carry a :class:`StreamVersion`) are tracked through
their delivery reports; once the whole batch is acknowledged, the publisher hands where each
stream's latest event landed to its ``on_published`` callback (the event store's
``published_streams``, see :mod:`cdc.published`), still before the engine commits. A failure
there fails the batch like a produce failure.
"""

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

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
class StreamVersion:
    """The event a record carries: its stream and the stream's version after it."""

    stream_id: str
    stream_type: str
    version: int


@dataclass(frozen=True)
class OutgoingChange:
    """One record for Kafka: destination topic, key, value (None = tombstone) and headers;
    ``stream`` is set on records of events."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: "HeaderList"
    stream: StreamVersion | None = None


@dataclass(frozen=True)
class PublishedEvent:
    """An event Kafka acknowledged, and where it landed."""

    stream: StreamVersion
    topic: str
    partition: int
    offset: int


TopicSpecFor = Callable[[str], TopicSpec]
OnPublished = Callable[[Sequence[PublishedEvent]], None]


def latest_per_stream(events: Iterable[PublishedEvent]) -> list[PublishedEvent]:
    """Each stream's highest version (the first record of it, should a version repeat)."""
    latest: dict[str, PublishedEvent] = {}
    for event in events:
        known = latest.get(event.stream.stream_id)
        if known is None or event.stream.version > known.stream.version:
            latest[event.stream.stream_id] = event
    return list(latest.values())


class ChangePublisher:
    """Produces batches of changes and waits for every acknowledgement."""

    def __init__(
        self,
        kafka: KafkaConfig,
        topic_partitions: int = 1,
        spec_for: TopicSpecFor | None = None,
        flush_timeout_s: float = 120.0,
        on_published: OnPublished | None = None,
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
        self._on_published = on_published
        self._errors: list[str] = []
        self._delivered: list[PublishedEvent] = []
        self.record_seconds = 0.0  # time spent in on_published (the last batch's)

    def _on_delivery(self, err: RdKafkaError | None, msg: Message) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}: {err.str()} [{err.name()}]")

    def _on_event_delivery(
        self, stream: StreamVersion, err: RdKafkaError | None, msg: Message
    ) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}: {err.str()} [{err.name()}]")
            return
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        if topic is None or partition is None or offset is None:
            self._errors.append(f"{stream.stream_id}: delivery report without a position")
            return
        self._delivered.append(PublishedEvent(stream, topic, partition, offset))

    def ensure_topic(self, topic: str) -> None:
        if topic not in self._ready_topics:
            try:
                self._admin.ensure(self._spec_for(topic))
            except Exception as exc:
                raise PublishError(f"cannot prepare topic {topic}: {exc}") from exc
            self._ready_topics.add(topic)

    def publish(self, changes: Iterable[OutgoingChange]) -> int:
        """Produce every change and block until all are acknowledged, then record where the
        events landed (``on_published``). Returns the count."""
        count = 0
        self._delivered = []
        self.record_seconds = 0.0
        for change in changes:
            self.ensure_topic(change.topic)
            on_delivery = (
                self._on_delivery
                if change.stream is None
                else partial(self._on_event_delivery, change.stream)
            )
            while True:
                try:
                    self._producer.produce(
                        change.topic,
                        key=change.key,
                        value=change.value,
                        headers=change.headers,
                        on_delivery=on_delivery,
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
        delivered, self._delivered = self._delivered, []
        if delivered and self._on_published is not None:
            started = time.perf_counter()
            try:
                self._on_published(latest_per_stream(delivered))
            except PublishError:
                raise
            except Exception as exc:
                raise PublishError(
                    f"cannot record where {len(delivered)} event(s) landed: {exc}; "
                    "the connector stops without committing them (a restart publishes them again)"
                ) from exc
            self.record_seconds = time.perf_counter() - started
        return count

    def close(self) -> None:
        self._producer.flush(self._flush_timeout_s)
