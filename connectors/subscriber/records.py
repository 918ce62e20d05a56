"""What a subscriber yields: a typed record with its position on Kafka.

``cdc.<schema>.<table>`` records become :class:`~tributary.changes.ChangeEvent` (a tombstone
is a ``ChangeEvent`` with ``op is None``); ``events.<aggregate>`` records become
:class:`EventRecord` — the event as the outbox publishes it: the Confluent wire format, a
record of the event's own type (its typed fields become ``data``, with Avro's types:
datetimes, lists, ...) and the ``_meta`` envelope, the writer's schema fetched from the
schema registry by its id. A caller that knows the domain's classes passes an
event decoder to turn it into the domain event (``event_store.subscription.domain_events``).
"""

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Generic, TypeVar

from connectors.avro import (
    AvroDecodeError,
    EventParts,
    SchemaCache,
    event_parts,
    registry_schemas,
    schema_id_of,
)
from tributary.changes import ChangeEvent

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
    """An event from ``events.<aggregate>``: its envelope, its data (typed fields), metadata.

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
    def from_parts(cls, topic: str, parts: EventParts) -> "EventRecord":
        meta = parts.meta
        event_id = meta["event_id"]
        return cls(
            topic=topic,
            event_id=event_id if isinstance(event_id, uuid.UUID) else uuid.UUID(str(event_id)),
            event_type=parts.event_type,
            schema_version=parts.schema_version,
            stream_type=str(meta["stream_type"]),
            stream_id=str(meta["stream_id"]),
            version=int(meta["version"]),
            position=int(meta["position"]),
            occurred_at=meta["occurred_at"],
            data=parts.data,
            metadata=parts.metadata,
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


#: Decrypts an event's personal fields: (writer schema, data) -> data (personal fields
#: stay opaque bytes without one).
Reveal = Callable[[Mapping[str, Any], dict[str, Any]], dict[str, Any]]


class EventDecoder:
    """Decodes ``events.*`` values (the Confluent wire format), fetching each writer schema
    from the schema registry by its id once (``schema_registry_url``)."""

    def __init__(self, schema_registry_url: str | None, reveal: "Reveal | None" = None) -> None:
        self.schema_registry_url = schema_registry_url
        self.reveal = reveal
        self.schemas: SchemaCache | None = (
            None if schema_registry_url is None else registry_schemas(schema_registry_url)
        )

    def decode(self, topic: str, value: bytes | None) -> EventRecord:
        if value is None:
            raise AvroDecodeError("an event record has no value (events are never deleted)")
        schema_id_of(value)  # not the wire format: say so before asking for a registry
        if self.schemas is None:
            raise AvroDecodeError(
                "events.* records name their schema by a registry id: subscribe with"
                " schema_registry_url"
            )
        schema, record = self.schemas.decode(value)
        parts = event_parts(record)
        if self.reveal is not None and parts.typed:
            parts = replace(parts, data=self.reveal(schema.definition, parts.data))
        return EventRecord.from_parts(topic, parts)
