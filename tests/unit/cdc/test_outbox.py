import base64
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from cdc.outbox import EventOutbox
from connectors.avro import (
    MAGIC,
    UNTYPED_EVENT_NAME,
    AvroDecodeError,
    SchemaCache,
    event_parts,
    schema_id_of,
)
from connectors.schema_registry.memory import MemoryRegistry
from event_store import Event, EventCodec, EventRegistry
from event_store.personal import MemoryKeys, decrypt, encrypt
from event_store.schemas import EventSchemaError, avro_schema, register_event_schemas
from examples.social.posts import POST_EVENTS, PostCreated

EVENT_ID = str(uuid.uuid4())
KEYS = MemoryKeys()  # a post's text is personal: stored and published encrypted
AUTHOR = ("user", "3")
DATA = {
    "post_id": 7,
    "author_id": 3,
    "text": encrypt(KEYS.key_for(AUTHOR), "hi #kafka", AUTHOR, "text"),
    "hashtags": ["kafka"],
    "created_at": "2026-11-21T20:00:00.5Z",
}


def _row(version: int = 1, schema_id: int | None = None) -> dict[str, object]:
    return {
        "position": 11,
        "transaction_id": 5,
        "event_id": EVENT_ID,
        "stream_id": "post-7",
        "stream_type": "post",
        "version": version,
        "event_type": "PostCreated",
        "schema_version": 2,
        "data": json.dumps(DATA),
        "metadata": '{"command_id":"c1"}',
        "recorded_at": "2026-11-21T20:00:01Z",
        "schema_id": schema_id,
    }


def _change(op: str = "c", **row: object) -> str:
    return json.dumps({"op": op, "before": None, "after": _row(**row), "source": {"lsn": 99}})  # type: ignore[arg-type]


def test_a_typed_row_becomes_a_record_of_its_type_in_the_confluent_wire_format() -> None:
    registry = MemoryRegistry()
    ids = register_event_schemas(POST_EVENTS, registry)
    schema_id = ids[("PostCreated", 2)]
    outbox = EventOutbox(registry)
    [event] = outbox.route(_change(schema_id=schema_id), b"99")
    assert event.topic == "events.post" and event.key == b"post-7"
    assert event.value is not None and event.value[:1] == MAGIC
    assert schema_id_of(event.value) == schema_id
    assert dict(event.headers) == {
        "event_type": b"PostCreated",
        "event_id": EVENT_ID.encode(),
        "version": b"1",
        "schema_version": b"2",
        "position": b"11",
        "lsn": b"99",
    }
    schema, record = SchemaCache(registry.schema_text).decode(event.value)
    assert schema.name == "io.tributary.events.PostCreated"
    assert record["created_at"] == datetime(2026, 11, 21, 20, 0, 0, 500000, tzinfo=UTC)
    assert record["hashtags"] == ["kafka"] and record["post_id"] == 7
    parts = event_parts(record)
    assert parts.typed and parts.event_type == "PostCreated" and parts.schema_version == 2
    assert parts.meta["event_id"] == uuid.UUID(EVENT_ID)
    assert parts.meta["occurred_at"] == datetime(2026, 11, 21, 20, 0, 1, tzinfo=UTC)
    assert parts.meta["position"] == 11 and parts.metadata == {"command_id": "c1"}
    assert decrypt(KEYS.key_for(AUTHOR), parts.data["text"], AUTHOR, "text") == "hi #kafka"
    assert b"hi #kafka" not in event.value


def test_a_row_without_a_schema_id_goes_out_with_the_untyped_envelope() -> None:
    registry = MemoryRegistry()
    outbox = EventOutbox(registry)
    [event] = outbox.route(_change(), b"1")
    [again] = outbox.route(_change(version=2), b"2")
    assert event.value is not None and again.value is not None
    assert schema_id_of(event.value) == schema_id_of(again.value)  # registered once
    assert registry.registry.subject_names() == [UNTYPED_EVENT_NAME]
    _, record = SchemaCache(registry.schema_text).decode(event.value)
    parts = event_parts(record)
    assert not parts.typed and parts.data == DATA and parts.event_type == "PostCreated"


def test_only_inserts_and_snapshot_reads_are_events() -> None:
    outbox = EventOutbox(MemoryRegistry())
    assert outbox.route(_change("d"), b"1") == []
    assert len(outbox.route(_change("r"), b"1")) == 1


def test_decoding_needs_the_wire_format_and_a_known_schema() -> None:
    registry = MemoryRegistry()
    cache = SchemaCache(registry.schema_text)
    with pytest.raises(AvroDecodeError, match="wire format"):
        cache.decode(b"plain json")
    with pytest.raises(AvroDecodeError, match="schema id 42"):
        cache.decode(b"\x00\x00\x00\x00\x2a\x02")
    [event] = EventOutbox(registry).route(_change(), b"1")
    assert event.value is not None
    with pytest.raises(AvroDecodeError, match="corrupt"):
        cache.decode(event.value[:8])


def test_an_event_class_gives_a_documented_typed_schema() -> None:
    schema = avro_schema(PostCreated)
    assert schema["name"] == "PostCreated" and schema["namespace"] == "io.tributary.events"
    assert schema["doc"].startswith("A post was written")
    fields = {f["name"]: f["type"] for f in schema["fields"]}
    assert fields["post_id"] == "long" and fields["text"] == "bytes"  # personal: encrypted
    [text] = [f for f in schema["fields"] if f["name"] == "text"]
    assert text["tributary.personal"] == {
        "subject": "user",
        "id_field": "author_id",
        "type": "string",
    }
    assert fields["hashtags"] == {"type": "array", "items": "string"}
    assert fields["created_at"] == {"type": "long", "logicalType": "timestamp-micros"}
    assert fields["_meta"]["name"] == "EventMeta"


@dataclass(frozen=True)
class Rated(Event, name="Rated", namespace="io.tributary.test"):
    """A rating."""

    stars: int
    note: str | None = None
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Odd(Event, name="Odd"):
    value: int | str


def test_optional_fields_and_defaults_become_avro_defaults() -> None:
    fields = {f["name"]: f for f in avro_schema(Rated)["fields"]}
    assert fields["note"]["type"] == ["null", "string"] and fields["note"]["default"] is None
    assert fields["tags"]["default"] == []
    assert "default" not in fields["stars"]
    with pytest.raises(EventSchemaError, match=r"Odd.value"):
        avro_schema(Odd)


@dataclass(frozen=True)
class Signed(Event, name="Signed", namespace="io.tributary.test"):
    """An event with a bytes field (the store keeps it as UTF-8 text in JSON)."""

    signature: bytes
    extra: bytes | None = None


def test_a_bytes_field_goes_out_as_avro_bytes() -> None:
    registry = MemoryRegistry()
    schema_id = register_event_schemas([Signed], registry)[("Signed", 1)]
    row = {
        **_row(schema_id=schema_id),
        "event_type": "Signed",
        "schema_version": 1,
        "stream_type": "signed",
        "data": json.dumps({"signature": "abc", "extra": None}),
    }
    event = EventOutbox(registry).record(row, b"1")
    assert event.value is not None
    _, record = SchemaCache(registry.schema_text).decode(event.value)
    assert record["signature"] == b"abc" and record["extra"] is None


def test_a_row_with_a_payload_is_published_as_is() -> None:
    outbox = EventOutbox(MemoryRegistry())
    payload = b"\x00\x00\x00\x00\x07whatever the store wrote"
    change = json.dumps(
        {
            "op": "c",
            "after": {**_row(schema_id=7), "payload": base64.b64encode(payload).decode()},
            "source": {"lsn": 99},
        }
    )
    [event] = outbox.route(change, b"99")
    assert event.value == payload and event.topic == "events.post" and event.key == b"post-7"
    assert dict(event.headers)["position"] == b"11"


def test_the_codecs_payload_head_is_the_outbox_value_before_meta() -> None:
    registry = MemoryRegistry()
    codec = EventCodec(EventRegistry(POST_EVENTS))
    ids = codec.register_schemas(registry)
    event = PostCreated(
        7, 3, "hi #kafka", ("kafka",), datetime(2026, 11, 21, 20, 0, 0, 500000, UTC)
    )
    new = codec.encode(event, {"command_id": "c1"}, KEYS)
    assert new.schema_id == ids[("PostCreated", 2)] and new.payload_head is not None
    row = {**_row(schema_id=new.schema_id), "data": json.dumps(new.data)}
    value = EventOutbox(registry).record(row, None).value
    assert value is not None and value.startswith(new.payload_head)
    assert len(value) > len(new.payload_head)  # _meta follows, appended by the store
    assert (  # no ids
        EventCodec(EventRegistry(POST_EVENTS)).encode(event, None, KEYS).payload_head is None
    )
