"""Avro in the Confluent wire format, the events' envelope, and writer schemas by registry id.

A value in the Confluent wire format is ``00`` (the magic byte) + the writer schema's id in the
schema registry (4 bytes, big-endian) + the Avro binary body: what Confluent's
``AvroSerializer`` writes and its ``AvroDeserializer`` (or any client configured with
``schema.registry.url``) reads. Readers fetch the writer's schema by id
(``GET /schemas/ids/{id}``) once and keep it (:class:`SchemaCache`).

An event on ``events.<aggregate>`` is a record named after its event type (subject = the
record's full name: the record-name strategy, several event types per topic). Its fields are
the event's own, typed, followed by :data:`META_FIELD` (``_meta``, an
``io.tributary.EventMeta`` record): id, type, schema version, stream, version in the stream,
position in the store, occurrence time and metadata, for readers that see only the value
(Spark, Kafka Connect sinks). The Kafka headers carry the same identity (``event_id``,
``event_type``, ``version``, ...). Events appended without a typed class are written with
:data:`UNTYPED_EVENT_SCHEMA` (``io.tributary.Event``: data and metadata as JSON text), in the
same wire format.
"""

import io
import json
import struct
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from connectors.errors import ConnectorError
from connectors.schema_registry.errors import RegistryUnavailableError

MAGIC = b"\x00"
HEADER_SIZE = 5
META_FIELD = "_meta"
UNTYPED_EVENT_NAME = "io.tributary.Event"


class AvroDecodeError(ConnectorError):
    """A value is not in the Confluent wire format, or its schema cannot be had."""


#: The envelope every typed event record ends with (field :data:`META_FIELD`).
EVENT_META_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "EventMeta",
    "namespace": "io.tributary",
    "doc": "Where an event sits in the event store (the Kafka headers carry the same).",
    "fields": [
        {
            "name": "event_id",
            "type": {"type": "string", "logicalType": "uuid"},
            "doc": "Unique id of the event: deduplicate on it.",
        },
        {"name": "event_type", "type": "string", "doc": "The event type's name as stored."},
        {
            "name": "schema_version",
            "type": "int",
            "doc": "The event class's version when it was appended (upcasters key on it).",
        },
        {"name": "stream_type", "type": "string", "doc": "The aggregate type (topic suffix)."},
        {"name": "stream_id", "type": "string", "doc": "The stream (also the record's key)."},
        {
            "name": "version",
            "type": "int",
            "doc": "Version of the event in its stream: 1, 2, ... per key.",
        },
        {"name": "position", "type": "long", "doc": "Sequence of the event in the store."},
        {
            "name": "occurred_at",
            "type": {"type": "long", "logicalType": "timestamp-micros"},
            "doc": "When the event store recorded the event.",
        },
        {"name": "metadata", "type": "string", "doc": "The event's metadata, a JSON object."},
    ],
}

#: Events appended without a typed class (a raw ``NewEvent``, rows older than typed events).
UNTYPED_EVENT_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Event",
    "namespace": "io.tributary",
    "doc": "An event without a typed schema: data and metadata are JSON objects as text.",
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


@dataclass(frozen=True)
class AvroSchema:
    """A parsed schema: its definition (docs and logical types kept) and fastavro's form."""

    definition: dict[str, Any]
    parsed: Any

    @classmethod
    def of(cls, definition: Mapping[str, Any] | str) -> "AvroSchema":
        loaded = json.loads(definition) if isinstance(definition, str) else dict(definition)
        return cls(loaded, parse_schema(loaded))

    @property
    def name(self) -> str:
        """The full name of a record schema (the record-name strategy's subject)."""
        return full_name(self.definition)

    @property
    def document(self) -> str:
        return json.dumps(self.definition, separators=(",", ":"))

    def encode(self, schema_id: int, record: Mapping[str, Any]) -> bytes:
        """``record`` in the Confluent wire format with ``schema_id``."""
        out = io.BytesIO()
        out.write(MAGIC)
        out.write(struct.pack(">I", schema_id))
        schemaless_writer(out, self.parsed, dict(record))
        return out.getvalue()

    def decode_body(self, body: bytes) -> dict[str, Any]:
        record = schemaless_reader(io.BytesIO(body), self.parsed, None)
        if not isinstance(record, dict):
            raise AvroDecodeError("an event value must be an Avro record")
        return record


def full_name(definition: Mapping[str, Any]) -> str:
    name = str(definition["name"])
    namespace = definition.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


def schema_id_of(value: bytes | None) -> int:
    """The writer schema's id of a value in the Confluent wire format."""
    if value is None:
        raise AvroDecodeError("the record has no value")
    if len(value) < HEADER_SIZE or value[:1] != MAGIC:
        raise AvroDecodeError("not in the Confluent wire format (no magic byte 0 + schema id)")
    schema_id: int = struct.unpack(">I", value[1:HEADER_SIZE])[0]
    return schema_id


class SchemaCache:
    """Writer schemas by id, fetched once each (``fetch(id)`` returns the schema's JSON text:
    a registry's ``GET /schemas/ids/{id}``), then kept: ids never change meaning."""

    def __init__(self, fetch: Callable[[int], str]) -> None:
        self._fetch = fetch
        self._by_id: dict[int, AvroSchema] = {}
        self._lock = threading.Lock()

    def add(self, schema_id: int, schema: AvroSchema) -> None:
        self._by_id[schema_id] = schema

    def schema(self, schema_id: int) -> AvroSchema:
        found = self._by_id.get(schema_id)
        if found is None:
            with self._lock:
                found = self._by_id.get(schema_id)
                if found is None:
                    try:
                        text = self._fetch(schema_id)
                    except RegistryUnavailableError:
                        raise  # the registry is down: retry later, not a dead letter
                    except ConnectorError as exc:
                        raise AvroDecodeError(f"schema id {schema_id}: {exc}") from exc
                    found = self._by_id[schema_id] = AvroSchema.of(text)
        return found

    def decode(self, value: bytes | None) -> tuple[AvroSchema, dict[str, Any]]:
        """The writer's schema and the decoded record of a Confluent wire-format value."""
        schema = self.schema(schema_id_of(value))
        assert value is not None
        try:
            return schema, schema.decode_body(value[HEADER_SIZE:])
        except (EOFError, ValueError, IndexError, TypeError) as exc:
            raise AvroDecodeError(f"a corrupt Avro body: {type(exc).__name__}: {exc}") from exc


_CACHES: dict[str, SchemaCache] = {}
_CACHES_LOCK = threading.Lock()


def use_schemas(url: str, cache: SchemaCache) -> None:
    """Make ``registry_schemas(url)`` answer ``cache`` (tests: a registry in memory)."""
    with _CACHES_LOCK:
        _CACHES[url] = cache


def registry_schemas(url: str) -> SchemaCache:
    """One :class:`SchemaCache` per registry URL and process (Spark executors reuse it)."""
    with _CACHES_LOCK:
        cache = _CACHES.get(url)
        if cache is None:
            from connectors.schema_registry.client import RegistryClient

            client = RegistryClient(url)
            cache = _CACHES[url] = SchemaCache(client.schema_text)
        return cache


@dataclass(frozen=True)
class EventParts:
    """An event value taken apart: its envelope (``_meta``, or the untyped record's fields)
    and its data (the typed fields, or the untyped record's JSON data parsed)."""

    event_type: str
    schema_version: int
    meta: dict[str, Any]
    data: dict[str, Any]
    metadata: dict[str, Any]
    typed: bool


def event_parts(record: Mapping[str, Any]) -> EventParts:
    """Split a decoded event record (typed or untyped) into envelope and data."""
    meta = record.get(META_FIELD)
    if isinstance(meta, dict):
        data = {k: v for k, v in record.items() if k != META_FIELD}
        typed = True
    elif "data" in record and "event_type" in record:
        meta = {k: v for k, v in record.items() if k != "data"}
        data = _json_object("data", record["data"])
        typed = False
    else:
        raise AvroDecodeError(f"not an event record (no {META_FIELD} field)")
    return EventParts(
        event_type=str(meta["event_type"]),
        schema_version=int(meta["schema_version"]),
        meta=meta,
        data=data,
        metadata=_json_object("metadata", meta.get("metadata")),
        typed=typed,
    )


def _json_object(field: str, text: object) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        parsed = json.loads(text) if isinstance(text, str | bytes) else text
    except json.JSONDecodeError as exc:
        raise AvroDecodeError(f"the event's {field} is not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise AvroDecodeError(f"the event's {field} is not a JSON object")
    return parsed


# -- JSON data <-> Avro values -----------------------------------------------------------


def from_json(schema: Mapping[str, Any], value: Any) -> Any:
    """JSON-form data (ISO-8601 times, as the event store keeps it) as the Python values
    fastavro writes with ``schema`` (datetimes for timestamps, dates for dates)."""
    return _from_json(schema, value, {}, str(schema.get("namespace") or ""))


def _from_json(node: Any, value: Any, names: dict[str, Any], namespace: str) -> Any:
    if node == "bytes" or (isinstance(node, Mapping) and node.get("type") == "bytes"):
        # The store's JSON keeps bytes as their UTF-8 text (pydantic's JSON mode).
        return value.encode() if isinstance(value, str) else value
    if isinstance(node, str):
        named = names.get(node) or names.get(f"{namespace}.{node}")
        return value if named is None else _from_json(named, value, names, namespace)
    if isinstance(node, list):
        if value is None:
            return None
        branches = [b for b in node if b != "null"]
        return _from_json(branches[0], value, names, namespace) if len(branches) == 1 else value
    kind = node.get("type")
    logical = node.get("logicalType")
    if kind == "record":
        ns = str(node.get("namespace") or namespace)
        names[full_name({"name": node["name"], "namespace": ns})] = node
        if not isinstance(value, Mapping):
            return value
        return {
            f["name"]: _from_json(f["type"], value.get(f["name"]), names, ns)
            for f in node["fields"]
            if f["name"] in value
        }
    if kind == "array":
        return (
            None
            if value is None
            else [_from_json(node["items"], v, names, namespace) for v in value]
        )
    if kind == "map":
        if value is None:
            return None
        return {k: _from_json(node["values"], v, names, namespace) for k, v in value.items()}
    if logical in ("timestamp-micros", "timestamp-millis") and isinstance(value, str):
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    if logical == "date" and isinstance(value, str):
        return date.fromisoformat(value)
    if isinstance(kind, (dict, list)):
        return _from_json(kind, value, names, namespace)
    return value
