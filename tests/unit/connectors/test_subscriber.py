"""The consumer SDK's pure parts: event records from the outbox's encoding, dead-letter
headers, the policies, and the arguments it refuses (no broker needed)."""

import json
import uuid
from datetime import UTC, datetime

import pytest

from cdc.outbox import EventOutbox
from connectors.avro import AvroDecodeError, SchemaCache
from connectors.kafka import KafkaConfig
from connectors.schema_registry.memory import MemoryRegistry
from connectors.subscriber import (
    KafkaPosition,
    SubscriberError,
    Undecodable,
    UndecodableRecordError,
    dead_letter_topic,
    raise_undecodable,
    skip_undecodable,
    subscribe,
)
from connectors.subscriber.policies import error_headers
from connectors.subscriber.records import EventDecoder, EventRecord
from event_store.personal import REDACTED_TEXT, MemoryKeys, Revealer, encrypt
from event_store.schemas import register_event_schemas
from examples.social.posts import POST_EVENTS

AUTHOR = ("user", "1")


def _event_value(registry: MemoryRegistry) -> tuple[str, bytes]:
    ids = register_event_schemas(POST_EVENTS, registry)
    row = {
        "event_id": str(uuid.uuid4()),
        "event_type": "PostCreated",
        "schema_version": 2,
        "stream_type": "post",
        "stream_id": "7",
        "version": 3,
        "position": 42,
        "recorded_at": "2026-01-01T00:00:00Z",
        "data": json.dumps(
            {
                "post_id": 7,
                "author_id": 1,
                "text": encrypt(KEYS.key_for(AUTHOR), "hi", AUTHOR, "text"),
                "hashtags": [],
                "created_at": "2026-01-01T00:00:00Z",
            }
        ),
        "metadata": None,
        "schema_id": ids[("PostCreated", 2)],
    }
    [record] = EventOutbox(registry).route(json.dumps({"op": "c", "after": row}), b"1")
    assert record.value is not None
    return row["event_id"], record.value


KEYS = MemoryKeys()


def test_an_event_value_decodes_into_a_typed_record() -> None:
    registry = MemoryRegistry()
    event_id, value = _event_value(registry)
    decoder = EventDecoder(None)
    with pytest.raises(AvroDecodeError, match="schema_registry_url"):
        decoder.decode("events.post", value)
    decoder.schemas = SchemaCache(registry.schema_text)
    record = decoder.decode("events.post", value)
    assert isinstance(record, EventRecord)
    assert record.event_id == uuid.UUID(event_id)
    assert (record.stream_id, record.version, record.position) == ("7", 3, 42)
    assert record.event_type == "PostCreated" and record.schema_version == 2
    plain = {
        "post_id": 7,
        "author_id": 1,
        "text": "hi",
        "hashtags": [],
        "created_at": datetime(2026, 1, 1, tzinfo=UTC),
    }
    # Personal fields stay opaque without a key (the post's text: its encrypted token)...
    assert isinstance(record.data["text"], bytes) and record.data["text"].startswith(b"tx1:")
    assert {k: v for k, v in record.data.items() if k != "text"} == {
        k: v for k, v in plain.items() if k != "text"
    }
    assert record.metadata == {}
    assert record.occurred_at.tzinfo is not None
    # ... a reader given the keys (reveal) reads them; once forgotten they read redacted.
    decoder.reveal = Revealer(KEYS.lookup)
    assert decoder.decode("events.post", value).data == plain
    decoder.reveal = Revealer(lambda wanted: {AUTHOR: None})  # the key destroyed
    assert decoder.decode("events.post", value).data == {**plain, "text": REDACTED_TEXT}


def test_values_that_are_not_events_are_refused() -> None:
    decoder = EventDecoder("http://127.0.0.1:1")
    with pytest.raises(AvroDecodeError, match="no value"):
        decoder.decode("events.post", None)
    with pytest.raises(AvroDecodeError, match="wire format"):
        decoder.decode("events.post", b"garbage")  # refused without asking the registry


def test_positions_order_and_resume_after() -> None:
    pos = KafkaPosition("events.post", 1, 9)
    assert pos.next() == KafkaPosition("events.post", 1, 10)
    assert str(pos) == "events.post[1]@9"
    assert sorted([pos.next(), pos]) == [pos, pos.next()]


def _undecodable() -> Undecodable:
    return Undecodable(
        KafkaPosition("cdc.public.users", 2, 5),
        b"k",
        b"v",
        {"lsn": b"1"},
        "ChangeDecodeError: value is not JSON",
        ValueError("x"),
        "team",
    )


def test_dead_letters_keep_the_headers_and_add_the_reason() -> None:
    assert dead_letter_topic("cdc.public.users") == "cdc.public.users.dlq"
    headers = dict(error_headers(_undecodable()))
    assert headers["lsn"] == b"1"
    assert headers["tributary.error.reason"] == b"ChangeDecodeError: value is not JSON"
    assert headers["tributary.error.stage"] == b"decode"
    assert headers["tributary.subscriber"] == b"team"
    assert headers["tributary.source.partition"] == b"2"
    assert headers["tributary.source.offset"] == b"5"


def test_the_skip_and_raise_policies() -> None:
    skip_undecodable(_undecodable())
    with pytest.raises(UndecodableRecordError, match=r"users\[2\]@5: ChangeDecodeError"):
        raise_undecodable(_undecodable())


def test_subscribe_refuses_what_cannot_work() -> None:
    kafka = KafkaConfig("127.0.0.1:1")
    with pytest.raises(SubscriberError, match="at least one topic"):
        subscribe([], "g", kafka=kafka)
    with pytest.raises(SubscriberError, match="needs a group_id"):
        subscribe(["cdc.public.users"], None, kafka=kafka)
    with pytest.raises(SubscriberError, match="start must be"):
        subscribe(["cdc.public.users"], "g", kafka=kafka, start="middle")  # type: ignore[arg-type]
