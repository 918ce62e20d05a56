"""Domain events for the consumer SDK: turns what ``connectors.subscriber`` reads from
``events.<aggregate>`` into the domain's event classes, upcast to their current version.

    from connectors.subscriber import subscribe
    from event_store.subscription import domain_events

    subscriber = subscribe(["events.post"], "search", kafka=kafka,
                           event_decoder=domain_events(EventCodec(POST_EVENTS, POST_UPCASTERS)))
    for delivery in subscriber:
        published = delivery.value          # a PublishedEvent (or a ChangeEvent on cdc.*)
        match published.event: ...
"""

from collections.abc import Callable
from dataclasses import dataclass

from pydantic_core import to_jsonable_python

from connectors.subscriber import EventRecord
from event_store.codec import EventCodec
from event_store.event import Event, Position, RecordedEvent


@dataclass(frozen=True)
class PublishedEvent:
    """A domain event as read from its topic: the decoded event and the envelope it came in
    (stream id, version — the per-key position —, event id, time, metadata)."""

    event: Event
    envelope: EventRecord

    @property
    def stream_id(self) -> str:
        return self.envelope.stream_id

    @property
    def version(self) -> int:
        return self.envelope.version


def domain_events(codec: EventCodec) -> Callable[[EventRecord], PublishedEvent]:
    """An ``event_decoder`` for ``subscribe``: upcasts and validates each event with ``codec``
    (an event it cannot decode goes to the subscriber's error policy)."""

    def decode(record: EventRecord) -> PublishedEvent:
        recorded = RecordedEvent(
            event_id=record.event_id,
            stream_id=record.stream_id,
            stream_type=record.stream_type,
            version=record.version,
            event_type=record.event_type,
            schema_version=record.schema_version,
            # Upcasters and the codec take the stored JSON form (typed Avro values -> JSON),
            # as on every other read path.
            data=to_jsonable_python(record.data),
            metadata=record.metadata,
            recorded_at=record.occurred_at,
            # The topic carries the store's sequence, not the writer's transaction id.
            position=Position(0, record.position),
        )
        return PublishedEvent(codec.decode(recorded), record)

    return decode
