"""What happens to a record that cannot be decoded: one typed callback, the error policy.

The policy is called with the :class:`Undecodable` record; when it returns, the record counts
as processed (its offset is committed with the next commit) and the subscriber goes on. A policy
that raises stops the subscriber before that record is committed.

:class:`DeadLetters` (the default) produces the record — key, value and headers kept — to a
dead-letter topic, ``<topic>.dlq`` unless one is named, with the reason in headers (the names
the view jobs' dead letters use): ``tributary.error.reason``, ``tributary.error.stage``
(``decode``), ``tributary.subscriber`` (the group id), ``tributary.source.topic``,
``tributary.source.partition``, ``tributary.source.offset``. It flushes before returning, so a
dead letter is never lost (at-least-once: a crash before the commit sends it again).
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Producer

from connectors.kafka.admin import TopicAdmin
from connectors.kafka.config import KafkaConfig
from connectors.kafka.producing import Deliveries, idempotent_producer
from connectors.kafka.topics import history_topic
from connectors.subscriber.errors import DeadLetterError, UndecodableRecordError
from connectors.subscriber.records import Headers, KafkaPosition

log = logging.getLogger(__name__)

DLQ_SUFFIX = ".dlq"
REASON_HEADER = "tributary.error.reason"
STAGE_HEADER = "tributary.error.stage"
SUBSCRIBER_HEADER = "tributary.subscriber"


@dataclass(frozen=True)
class Undecodable:
    """A record the subscriber could not turn into a typed record, and why."""

    position: KafkaPosition
    key: bytes | None
    value: bytes | None
    headers: Headers
    reason: str
    error: Exception
    group_id: str | None


ErrorPolicy = Callable[[Undecodable], None]


def dead_letter_topic(topic: str) -> str:
    """The default dead-letter topic of a topic."""
    return topic + DLQ_SUFFIX


def error_headers(record: Undecodable) -> list[tuple[str, str | bytes | None]]:
    """The record's own headers, then the ones that say why and where it was rejected."""
    out: list[tuple[str, str | bytes | None]] = list(record.headers.items())
    out += [
        (REASON_HEADER, record.reason.encode()),
        (STAGE_HEADER, b"decode"),
        (SUBSCRIBER_HEADER, (record.group_id or "").encode()),
        ("tributary.source.topic", record.position.topic.encode()),
        ("tributary.source.partition", str(record.position.partition).encode()),
        ("tributary.source.offset", str(record.position.offset).encode()),
    ]
    return out


class DeadLetters:
    """The default policy: produce the record to its dead-letter topic (created on first use,
    a history topic: kept forever) and flush."""

    def __init__(self, kafka: KafkaConfig, topic: str | None = None, timeout: float = 30.0):
        self.kafka = kafka
        self.topic = topic
        self.timeout = timeout
        self._producer: Producer | None = None
        self._ready: set[str] = set()

    def topic_for(self, source_topic: str) -> str:
        return self.topic or dead_letter_topic(source_topic)

    def __call__(self, record: Undecodable) -> None:
        topic = self.topic_for(record.position.topic)
        if topic not in self._ready:
            TopicAdmin(self.kafka).ensure(history_topic(topic))
            self._ready.add(topic)
        if self._producer is None:
            self._producer = idempotent_producer(self.kafka, java_placement=True)
        deliveries = Deliveries()
        self._producer.produce(
            topic,
            key=record.key,
            value=record.value,
            headers=error_headers(record),
            on_delivery=deliveries,
        )
        failure = deliveries.confirm(self._producer, self.timeout)
        if failure is not None:
            raise DeadLetterError(
                f"the dead letter of {record.position} was not acknowledged by {topic}"
                f" ({failure}); the record is not committed"
            )
        log.warning("%s: sent to %s: %s", record.position, topic, record.reason)


def skip_undecodable(record: Undecodable) -> None:
    """A policy: log the record and move on (nothing is kept)."""
    log.warning("%s: skipped: %s", record.position, record.reason)


def raise_undecodable(record: Undecodable) -> None:
    """A policy: stop; the record is not committed."""
    raise UndecodableRecordError(f"{record.position}: {record.reason}") from record.error
