"""The social folds' event decoding: typed records and untyped ones (a raw append, an old
``PostPublished`` v1) come out in the same JSON shape, upcast to today's type."""

import json
import uuid

from cdc.outbox import EventOutbox
from connectors.avro import SchemaCache
from connectors.schema_registry.memory import MemoryRegistry
from event_store.schemas import register_event_schemas
from examples.social.posts import POST_EVENTS
from examples.social.views.folds import decode_event


def _row(event_type: str, version: int, data: dict[str, object], schema_id: int | None) -> str:
    row = {
        "event_id": str(uuid.uuid4()),
        "event_type": event_type,
        "schema_version": version,
        "stream_type": "post",
        "stream_id": "post-3",
        "version": 1,
        "position": 5,
        "recorded_at": "2026-01-02T03:04:05Z",
        "data": json.dumps(data),
        "metadata": "{}",
        "schema_id": schema_id,
    }
    return json.dumps({"op": "c", "after": row})


def test_typed_and_untyped_events_decode_to_the_same_json_shape() -> None:
    registry = MemoryRegistry()
    ids = register_event_schemas(POST_EVENTS, registry)
    outbox = EventOutbox(registry)
    schemas = SchemaCache(registry.schema_text)
    created = {
        "post_id": 3,
        "author_id": 2,
        "text": "hi #kafka",
        "hashtags": ["kafka"],
        "created_at": "2026-01-02T03:04:05.250000Z",
    }
    [typed] = outbox.route(_row("PostCreated", 2, created, ids[("PostCreated", 2)]), b"1")
    [untyped] = outbox.route(_row("PostCreated", 2, created, None), b"2")
    old = {"post_id": 3, "author_id": 2, "text": "hi #Kafka", "published_at": created["created_at"]}
    [published] = outbox.route(_row("PostPublished", 1, old, None), b"3")
    decoded = [decode_event(r.value or b"", schemas) for r in (typed, untyped, published)]
    assert [d["event_type"] for d in decoded] == ["PostCreated"] * 3
    assert decoded[0]["data"] == created
    assert decoded[1]["data"] == created
    assert decoded[2]["data"] == {**created, "text": "hi #Kafka"}  # upcast v1 -> v2
    assert [d["version"] for d in decoded] == [1, 1, 1]
