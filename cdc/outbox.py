"""CDC's side of the event store's outbox: the captured rows of ``<schema>.events`` become
the records :mod:`event_store.outbox` describes (``events.<stream_type>``, keyed by stream
id), each with the LSN of its change as one more header. The table is append-only: only
inserts (and snapshot reads) are published."""

import json
from typing import Any

from cdc.publisher import LSN_HEADER, HeaderList, OutgoingChange, StreamVersion
from event_store.outbox import EVENT_TOPIC_PREFIX, EventEncoder, OutboxRegistry


class EventOutbox:
    """Routes the Debezium changes of the outbox table to event records."""

    def __init__(self, registry: OutboxRegistry, topic_prefix: str = EVENT_TOPIC_PREFIX) -> None:
        self.topic_prefix = topic_prefix
        self.encoder = EventEncoder(registry, topic_prefix)

    def route(self, envelope: str, lsn: bytes) -> list[OutgoingChange]:
        change: dict[str, Any] = json.loads(envelope)
        if change.get("op") not in ("c", "r"):
            return []  # the table is append-only: nothing else can happen to an event
        return [self.record(change["after"], lsn)]

    def record(self, row: dict[str, Any], lsn: bytes | None) -> OutgoingChange:
        """The Kafka record of one ``events`` row (columns as Debezium renders them)."""
        event = self.encoder.record(row)
        headers: HeaderList = list(event.headers)
        if lsn is not None:
            headers.append((LSN_HEADER, lsn))
        return OutgoingChange(
            event.topic,
            event.key,
            event.value,
            headers,
            StreamVersion(event.stream_id, event.stream_type, event.version),
        )
