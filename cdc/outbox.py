"""The outbox: rows of the event store's ``events`` table become records on
``events.<stream_type>``, so events reach Kafka through the database, never by a dual write.

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
version (the per-stream position sinks guard on), schema version, position and the LSN.
"""

import base64
import json
from datetime import datetime
from typing import Any, Protocol

from cdc.publisher import LSN_HEADER, HeaderList, OutgoingChange, StreamVersion
from connectors.avro import (
    META_FIELD,
    UNTYPED_EVENT_NAME,
    UNTYPED_EVENT_SCHEMA,
    AvroSchema,
    SchemaCache,
    from_json,
)

EVENT_TOPIC_PREFIX = "events."

UNTYPED = AvroSchema.of(UNTYPED_EVENT_SCHEMA)


class OutboxRegistry(Protocol):
    """What the outbox needs of a schema registry (a
    :class:`~connectors.schema_registry.client.RegistryClient` has it)."""

    def register(self, subject: str, schema: str) -> int: ...

    def schema_text(self, schema_id: int) -> str: ...


def event_topic(stream_type: str, prefix: str = EVENT_TOPIC_PREFIX) -> str:
    return f"{prefix}{stream_type}"


class EventOutbox:
    """Turns a captured ``events`` row into the event record, encoded with its schema."""

    def __init__(self, registry: OutboxRegistry, topic_prefix: str = EVENT_TOPIC_PREFIX) -> None:
        self.topic_prefix = topic_prefix
        self._registry = registry
        self.schemas = SchemaCache(registry.schema_text)
        self._untyped_id: int | None = None

    def route(self, envelope: str, lsn: bytes) -> list[OutgoingChange]:
        change: dict[str, Any] = json.loads(envelope)
        if change.get("op") not in ("c", "r"):
            return []  # the table is append-only: nothing else can happen to an event
        return [self.record(change["after"], lsn)]

    def record(self, row: dict[str, Any], lsn: bytes | None) -> OutgoingChange:
        """The Kafka record of one ``events`` row (columns as Debezium renders them)."""
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
        headers: HeaderList = [
            ("event_type", meta["event_type"].encode()),
            ("event_id", meta["event_id"].encode()),
            ("version", str(meta["version"]).encode()),
            ("schema_version", str(meta["schema_version"]).encode()),
            ("position", str(meta["position"]).encode()),
        ]
        if lsn is not None:
            headers.append((LSN_HEADER, lsn))
        return OutgoingChange(
            event_topic(meta["stream_type"], self.topic_prefix),
            meta["stream_id"].encode(),
            value,
            headers,
            StreamVersion(meta["stream_id"], meta["stream_type"], meta["version"]),
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
