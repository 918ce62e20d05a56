"""The event store's outbox: what a row of its ``events`` table becomes on Kafka.

Events reach Kafka through the database, never by a dual write: the store appends rows to
``<schema>.events`` and CDC (:mod:`cdc.outbox`) publishes each captured row as the record this
module describes - on ``events.<stream_type>``, keyed by stream id.

Each event is written in the Confluent wire format (magic byte 0, the schema id, the Avro
body) with the schema the row's ``schema_id`` names: the command processor registered it in
the schema registry before it appended the event (:mod:`event_store.schemas`), so the outbox
never registers a typed schema. A row with a ``payload`` (typed events appended since the
column exists) is published as is: the store wrote the complete value, ``_meta`` included, so
Debezium's EventRouter on Kafka Connect publishes the same bytes
(:meth:`connectors.debezium.DebeziumPostgresConfig.outbox_connector_properties`). An older
typed row is encoded here: the schema fetched by id (once), the row's JSON data, ``_meta``.
A row without a schema id (a raw ``NewEvent``, or appended before typed events) is written
with the untyped envelope :data:`connectors.avro.UNTYPED_EVENT_SCHEMA` (registered once, by
the outbox, under ``io.tributary.Event``). Key = stream id; headers: event type, event id,
version (the per-stream position sinks guard on), schema version and position.
"""

import base64
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from connectors.avro import (
    META_FIELD,
    UNTYPED_EVENT_NAME,
    UNTYPED_EVENT_SCHEMA,
    AvroSchema,
    SchemaCache,
    from_json,
)

OUTBOX_TABLE = "events"  # the table CDC captures: ``<event store schema>.events``
EVENT_TOPIC_PREFIX = "events."

UNTYPED = AvroSchema.of(UNTYPED_EVENT_SCHEMA)


def outbox_table(schema: str) -> str:
    """The qualified name of the event store's outbox table in ``schema``."""
    return f"{schema}.{OUTBOX_TABLE}"


def event_topic(stream_type: str, prefix: str = EVENT_TOPIC_PREFIX) -> str:
    return f"{prefix}{stream_type}"


class OutboxRegistry(Protocol):
    """What the outbox needs of a schema registry (a
    :class:`~connectors.schema_registry.client.RegistryClient` has it)."""

    def register(self, subject: str, schema: str) -> int: ...

    def schema_text(self, schema_id: int) -> str: ...


@dataclass(frozen=True)
class EventRecord:
    """The Kafka record of one event: topic, key (the stream id), value, headers, and the
    stream and version it carries."""

    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    stream_id: str
    stream_type: str
    version: int


class EventEncoder:
    """Turns an ``events`` row (columns as Debezium renders them) into its record."""

    def __init__(self, registry: OutboxRegistry, topic_prefix: str = EVENT_TOPIC_PREFIX) -> None:
        self.topic_prefix = topic_prefix
        self._registry = registry
        self.schemas = SchemaCache(registry.schema_text)
        self._untyped_id: int | None = None

    def record(self, row: dict[str, Any]) -> EventRecord:
        meta = {
            "event_id": str(row["event_id"]),
            "event_type": row["event_type"],
            "schema_version": int(row["schema_version"]),
            "stream_type": row["stream_type"],
            "stream_id": row["stream_id"],
            "version": int(row["version"]),
            "position": int(row["position"]),
            "occurred_at": _timestamp(row["recorded_at"]),
            "metadata": _json_text(row.get("metadata")),
        }
        schema_id = row.get("schema_id")
        payload = row.get("payload")
        if payload is not None:  # Debezium renders bytea as base64 in JSON
            value = payload if isinstance(payload, bytes) else base64.b64decode(payload)
        elif schema_id is None:
            value = UNTYPED.encode(self._untyped(), {**meta, "data": _json_text(row["data"])})
        else:
            schema = self.schemas.schema(int(schema_id))
            data = row["data"]
            fields = json.loads(data) if isinstance(data, str) else dict(data)
            typed = from_json(schema.definition, {**fields, META_FIELD: meta})
            value = schema.encode(int(schema_id), typed)
        headers = [
            ("event_type", meta["event_type"].encode()),
            ("event_id", meta["event_id"].encode()),
            ("version", str(meta["version"]).encode()),
            ("schema_version", str(meta["schema_version"]).encode()),
            ("position", str(meta["position"]).encode()),
        ]
        return EventRecord(
            event_topic(meta["stream_type"], self.topic_prefix),
            meta["stream_id"].encode(),
            value,
            headers,
            meta["stream_id"],
            meta["stream_type"],
            meta["version"],
        )

    def _untyped(self) -> int:
        if self._untyped_id is None:
            self._untyped_id = self._registry.register(UNTYPED_EVENT_NAME, UNTYPED.document)
            self.schemas.add(self._untyped_id, UNTYPED)
        return self._untyped_id


def _json_text(value: object) -> str:
    if value is None:
        return "{}"
    return value if isinstance(value, str) else json.dumps(value)


def _timestamp(value: object) -> datetime:
    """Debezium renders timestamptz as ISO-8601 text (``...Z``) and timestamps as epoch µs."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, int):
        return datetime.fromtimestamp(value / 1_000_000).astimezone()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
