"""What the publisher records after a batch: each stream's latest event and where it landed."""

import json
from pathlib import Path

import pytest

from cdc.outbox import EventOutbox
from cdc.publisher import PublishedEvent, StreamVersion, latest_per_stream
from connectors.debezium import DebeziumPostgresConfig
from connectors.postgres import PostgresConfig
from connectors.schema_registry.memory import MemoryRegistry


def _event(stream_id: str, version: int, offset: int) -> PublishedEvent:
    return PublishedEvent(StreamVersion(stream_id, "post", version), "events.post", 0, offset)


def test_each_stream_keeps_its_highest_version_and_that_records_offset() -> None:
    events = [_event("a", 1, 10), _event("b", 1, 11), _event("a", 2, 12), _event("a", 2, 15)]
    latest = {e.stream.stream_id: e for e in latest_per_stream(events)}
    assert latest == {"a": _event("a", 2, 12), "b": _event("b", 1, 11)}


def test_an_outbox_record_says_which_stream_version_it_carries() -> None:
    row = {
        "position": 11,
        "transaction_id": 5,
        "event_id": "6f1c1d8e-51a5-4d0e-9f55-5f0f3c1b2a11",
        "stream_id": "post-7",
        "stream_type": "post",
        "version": 4,
        "event_type": "PostEdited",
        "schema_version": 1,
        "data": "{}",
        "metadata": "{}",
        "recorded_at": "2026-11-21T20:00:00Z",
    }
    change = json.dumps({"op": "c", "after": row, "source": {"lsn": 9}})
    [event] = EventOutbox(MemoryRegistry()).route(change, b"9")
    assert event.stream == StreamVersion("post-7", "post", 4)


def test_the_connector_refuses_to_capture_its_own_record_of_published_streams() -> None:
    db = PostgresConfig("postgresql+psycopg://app@db:5432/shop")
    config = DebeziumPostgresConfig(
        "shop", db, ("es.events",), outbox_table="es.events", offsets_file=Path("/x")
    )
    assert config.outbox_schema == "es"
    assert DebeziumPostgresConfig("shop", db, ("public.users",)).outbox_schema is None
    with pytest.raises(ValueError, match="published_streams"):
        DebeziumPostgresConfig(
            "shop", db, ("es.events", "es.published_streams"), outbox_table="es.events"
        )
