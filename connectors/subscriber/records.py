"""What a subscriber yields: a typed record with its position on Kafka.

``cdc.<schema>.<table>`` records become :class:`~connectors.changes.ChangeEvent` (a tombstone
is a ``ChangeEvent`` with ``op is None``); ``events.<aggregate>`` records become
:class:`EventRecord` — the event as the outbox publishes it today: Avro single-object encoded
with one generic envelope (``data`` and ``metadata`` JSON objects), the writer's schema found by
fingerprint in ``_tributary_fingerprints``. A caller that knows the domain's classes passes an
event decoder to turn it into the domain event (``event_store.subscription.domain_events``).
"""

import json
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from connectors.avro import FINGERPRINTS_TOPIC, AvroDecodeError, SchemaCatalog, fingerprint_of
from connectors.changes import ChangeEvent
from connectors.kafka.admin import TopicAdmin
from connectors.kafka.config import KafkaConfig
from connectors.kafka.reading import read_topic

E = TypeVar("E")

Headers = dict[str, bytes | None]


@dataclass(frozen=True, order=True)
class KafkaPosition:
    """Where a record sits: topic, partition, offset (the offset grows per partition)."""

    topic: str
    partition: int
    offset: int

    def next(self) -> "KafkaPosition":
        """The position to resume from once this record is processed (``start=`` takes it)."""
        return KafkaPosition(self.topic, self.partition, self.offset + 1)

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


@dataclass(frozen=True)
class EventRecord:
    """An event from ``events.<aggregate>``: the published envelope, data and metadata parsed.

    ``version`` is the event's version in its stream (it grows by one per event of a key:
    the per-key position to deduplicate on); ``position`` is its sequence in the event store.
    """

    topic: str
    event_id: uuid.UUID
    event_type: str
    schema_version: int
    stream_type: str
    stream_id: str
    version: int
    position: int
    occurred_at: datetime
    data: dict[str, Any]
    metadata: dict[str, Any]

    @classmethod
    def from_envelope(cls, topic: str, envelope: dict[str, Any]) -> "EventRecord":
        event_id = envelope["event_id"]
        return cls(
            topic=topic,
            event_id=event_id if isinstance(event_id, uuid.UUID) else uuid.UUID(str(event_id)),
            event_type=str(envelope["event_type"]),
            schema_version=int(envelope["schema_version"]),
            stream_type=str(envelope["stream_type"]),
            stream_id=str(envelope["stream_id"]),
            version=int(envelope["version"]),
            position=int(envelope["position"]),
            occurred_at=envelope["occurred_at"],
            data=_json_object("data", envelope["data"]),
            metadata=_json_object("metadata", envelope["metadata"]),
        )


@dataclass(frozen=True)
class Delivery(Generic[E]):
    """One record as delivered: ``value`` is a :class:`ChangeEvent` (``cdc.*``) or the event
    (``events.*``: an :class:`EventRecord`, or what the subscriber's event decoder made of it)."""

    value: ChangeEvent | E
    position: KafkaPosition
    key: bytes | None
    headers: Headers
    timestamp_ms: int | None


class EventDecoder:
    """Decodes ``events.*`` values, reading writer schemas from ``_tributary_fingerprints``.

    The fingerprints topic is read when a value names a schema not seen yet (at most once per
    ``refresh_after`` seconds, so a corrupt record does not make every record re-read it).
    """

    def __init__(self, kafka: KafkaConfig, refresh_after: float = 2.0) -> None:
        self.kafka = kafka
        self.catalog = SchemaCatalog()
        self.refresh_after = refresh_after
        self._refreshed_at: float | None = None

    def decode(self, topic: str, value: bytes | None) -> EventRecord:
        if value is None:
            raise AvroDecodeError("an event record has no value (events are never deleted)")
        try:
            envelope = self.catalog.decode(value)
        except AvroDecodeError:
            fingerprint_of(value)  # not Avro at all: no point re-reading the schemas
            if not self._refresh():
                raise
            envelope = self.catalog.decode(value)
        return EventRecord.from_envelope(topic, envelope)

    def _refresh(self) -> bool:
        now = time.monotonic()
        if self._refreshed_at is not None and now - self._refreshed_at < self.refresh_after:
            return False
        self._refreshed_at = now
        if TopicAdmin(self.kafka).partition_count(FINGERPRINTS_TOPIC) is None:
            return False
        for record in read_topic(self.kafka, FINGERPRINTS_TOPIC):
            self.catalog.add_record(record.key, record.value)
        return True


def _json_object(field: str, text: object) -> dict[str, Any]:
    try:
        parsed = json.loads(text) if isinstance(text, str | bytes) else text
    except json.JSONDecodeError as exc:
        raise AvroDecodeError(f"the event's {field} is not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise AvroDecodeError(f"the event's {field} is not a JSON object")
    return parsed
