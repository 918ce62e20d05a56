import json
import uuid
from datetime import UTC, datetime

import pytest

from cdc.outbox import EVENT_SCHEMA, EventOutbox
from connectors.avro import MAGIC, AvroDecodeError, AvroSchema, SchemaCatalog

EVENT_ID = str(uuid.uuid4())


def _row_change(op: str = "c", version: int = 1) -> str:
    row = {
        "position": 11,
        "transaction_id": 5,
        "event_id": EVENT_ID,
        "stream_id": "post-7",
        "stream_type": "post",
        "version": version,
        "event_type": "PostCreated",
        "schema_version": 2,
        "data": '{"text":"hi"}',
        "metadata": '{"command_id":"c1"}',
        "recorded_at": "2026-11-21T20:00:00.5Z",
    }
    return json.dumps({"op": op, "before": None, "after": row, "source": {"lsn": 99}})


def test_an_event_row_becomes_an_avro_event_with_its_schema_published_once() -> None:
    outbox = EventOutbox()
    schema_record, event = outbox.route(_row_change(), b"99")
    assert schema_record.topic == "_tributary_fingerprints"
    assert schema_record.key == EVENT_SCHEMA.key.encode()
    assert event.topic == "events.post" and event.key == b"post-7"
    assert event.value is not None and event.value[:2] == MAGIC
    assert dict(event.headers) == {
        "event_type": b"PostCreated",
        "event_id": EVENT_ID.encode(),
        "version": b"1",
        "schema_version": b"2",
        "lsn": b"99",
    }
    [second] = outbox.route(_row_change(version=2), b"100")
    assert second.topic == "events.post"  # the schema is not published again

    catalog = SchemaCatalog()
    catalog.add_record(schema_record.key, schema_record.value)
    decoded = catalog.decode(event.value)
    assert decoded["event_id"] == uuid.UUID(EVENT_ID)
    assert decoded["occurred_at"] == datetime(2026, 11, 21, 20, 0, 0, 500000, tzinfo=UTC)
    assert json.loads(decoded["data"]) == {"text": "hi"}
    assert decoded["schema_version"] == 2 and decoded["position"] == 11


def test_only_inserts_and_snapshot_reads_are_events() -> None:
    assert EventOutbox().route(_row_change("d"), b"1") == []
    assert len(EventOutbox().route(_row_change("r"), b"1")) == 2


def test_decoding_needs_the_marker_and_a_known_schema() -> None:
    catalog = SchemaCatalog()
    with pytest.raises(AvroDecodeError, match="marker"):
        catalog.decode(b"plain json")
    [_, event] = EventOutbox().route(_row_change(), b"1")
    with pytest.raises(AvroDecodeError, match="_tributary_fingerprints"):
        catalog.decode(event.value or b"")


def test_a_schemas_record_must_match_its_fingerprint() -> None:
    other = AvroSchema.of({"type": "record", "name": "X", "fields": []})
    with pytest.raises(AvroDecodeError, match="fingerprint"):
        SchemaCatalog().add_record(other.key.encode(), EVENT_SCHEMA.document.encode())
