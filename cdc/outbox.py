"""The outbox: rows of the event store's ``events`` table become records on
``events.<stream_type>``, so events reach Kafka through the database, never by a dual write.

Each event is Avro single-object encoded with :data:`EVENT_SCHEMA`, whose canonical form is
published once (per connector run) to the compacted ``_tributary_fingerprints`` topic, keyed
by fingerprint, before the first event that uses it. Key = stream id; headers: event type,
event id, version (the per-stream position sinks guard on) and the LSN.
"""

import json
from datetime import datetime
from typing import Any

from cdc.publisher import LSN_HEADER, HeaderList, OutgoingChange, StreamVersion
from connectors.avro import FINGERPRINTS_TOPIC, AvroSchema

EVENT_TOPIC_PREFIX = "events."

EVENT_SCHEMA = AvroSchema.of(
    {
        "type": "record",
        "name": "Event",
        "namespace": "io.tributary",
        "doc": "An event of the Tributary event store; data and metadata are JSON objects.",
        "fields": [
            {"name": "event_id", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "event_type", "type": "string"},
            {"name": "schema_version", "type": "int"},
            {"name": "stream_type", "type": "string"},
            {"name": "stream_id", "type": "string"},
            {"name": "version", "type": "int"},
            {"name": "position", "type": "long"},
            {"name": "occurred_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "data", "type": "string"},
            {"name": "metadata", "type": "string"},
        ],
    }
)


def event_topic(stream_type: str, prefix: str = EVENT_TOPIC_PREFIX) -> str:
    return f"{prefix}{stream_type}"


class EventOutbox:
    """Turns a captured ``events`` row into the event record (and the schema record once)."""

    def __init__(self, topic_prefix: str = EVENT_TOPIC_PREFIX) -> None:
        self.topic_prefix = topic_prefix
        self._schema_published = False

    def route(self, envelope: str, lsn: bytes) -> list[OutgoingChange]:
        change: dict[str, Any] = json.loads(envelope)
        if change.get("op") not in ("c", "r"):
            return []  # the table is append-only: nothing else can happen to an event
        row = change["after"]
        record = {
            "event_id": str(row["event_id"]),
            "event_type": row["event_type"],
            "schema_version": int(row["schema_version"]),
            "stream_type": row["stream_type"],
            "stream_id": row["stream_id"],
            "version": int(row["version"]),
            "position": int(row["position"]),
            "occurred_at": _timestamp(row["recorded_at"]),
            "data": _json_text(row["data"]),
            "metadata": _json_text(row.get("metadata")),
        }
        headers: HeaderList = [
            ("event_type", record["event_type"].encode()),
            ("event_id", record["event_id"].encode()),
            ("version", str(record["version"]).encode()),
            ("schema_version", str(record["schema_version"]).encode()),
            (LSN_HEADER, lsn),
        ]
        out = []
        if not self._schema_published:
            out.append(
                OutgoingChange(
                    FINGERPRINTS_TOPIC,
                    EVENT_SCHEMA.key.encode(),
                    EVENT_SCHEMA.document.encode(),
                    [],
                )
            )
            self._schema_published = True
        out.append(
            OutgoingChange(
                event_topic(record["stream_type"], self.topic_prefix),
                record["stream_id"].encode(),
                EVENT_SCHEMA.encode(record),
                headers,
                StreamVersion(record["stream_id"], record["stream_type"], record["version"]),
            )
        )
        return out


def _json_text(value: object) -> str:
    if value is None:
        return "{}"
    return value if isinstance(value, str) else json.dumps(value)


def _timestamp(value: object) -> datetime:
    """Debezium renders timestamptz as ISO-8601 text (``...Z``) and timestamps as epoch µs."""
    if isinstance(value, int):
        return datetime.fromtimestamp(value / 1_000_000).astimezone()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
