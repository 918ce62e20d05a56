"""End to end: a command on the `commands` topic -> its result on `command-results` -> its
events on `events.<stream_type>` through CDC of the events table (no dual write), typed, in the
Confluent wire format, decoded by Confluent's own ``AvroDeserializer`` from the registry."""

import contextlib
import json
import struct
import threading
from collections.abc import Callable
from datetime import datetime

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from sqlalchemy import text

from connectors.kafka import TopicAdmin
from event_store.command import Accepted
from event_store.command_topic import CommandClient, CommandProcessor, CommandTopics, ensure_topics
from event_store.event import NewEvent
from event_store.schemas import avro_schema
from examples.social.posts import CreatePost, EditPost, PostCreated, PostEdited
from infra.errors import WaitTimeoutError
from tests.integration.cdc_process import CdcProcess
from tests.integration.conftest import Endpoints
from tests.integration.event_store.conftest import StoreEnv, plain_text
from tests.integration.kafka_reading import read_topic, wait_until

Factory = Callable[..., CdcProcess]


def test_a_command_on_kafka_yields_its_result_and_its_events_via_cdc(
    stack: Endpoints,
    unique: str,
    env: StoreEnv,
    connector_factory: Factory,
) -> None:
    topics = CommandTopics(commands=f"commands-{unique}", results=f"command-results-{unique}")
    ensure_topics(stack.kafka, topics)
    bus = env.bus()
    processor = CommandProcessor(bus, stack.kafka, topics, consumer_name=f"proc-{unique}")
    worker = threading.Thread(target=processor.run, daemon=True)
    worker.start()
    client = CommandClient(stack.kafka, topics)
    try:
        created = client.send_and_wait(
            "CreatePost", {"post_id": 7, "author_id": 1, "text": "hello #kafka #cdc"}, timeout=60
        )
        edited = client.send_and_wait(
            "EditPost", {"post_id": 7, "text": "edited #kafka"}, timeout=60
        )
        rejected = client.send_and_wait(
            "EditPost", {"post_id": 8, "text": "no such post"}, timeout=60
        )
    finally:
        processor.stop()
        worker.join(30)
        processor.close()
    assert isinstance(created, Accepted) and isinstance(edited, Accepted)
    assert rejected.status == "rejected"
    event_ids = [*created.event_ids, *edited.event_ids]

    connector = connector_factory([f"{env.schema}.events"], cdc_outbox_table=f"{env.schema}.events")
    connector.start()
    ours = set(event_ids)

    def published() -> list[tuple[bytes | None, bytes | None, dict[str, bytes | None]]]:
        if "events.post" not in TopicAdmin(stack.kafka).topic_names():
            return []
        return [
            (r.key, r.value, r.headers)
            for r in read_topic(stack.kafka, "events.post")
            if (r.headers.get("event_id") or b"").decode() in ours
        ]

    wait_until(lambda: len(published()) >= len(event_ids), 120, "the events on events.post", 1)
    records = published()

    # Confluent's own deserializer, pointed at the registry, decodes them: typed dicts.
    registry = SchemaRegistryClient({"url": stack.settings.registry_url})
    deserialize = AvroDeserializer(registry)
    context = SerializationContext("events.post", MessageField.VALUE)
    decoded = [deserialize(value, context) for _, value, _ in records]
    post_created, post_edited = decoded
    assert post_created["hashtags"] == ["kafka", "cdc"] and post_created["post_id"] == 7
    assert post_created["author_id"] == 1  # the text is personal: opaque without its key
    assert plain_text(env.admin, env.schema, 1, post_created["text"]) == "hello #kafka #cdc"
    assert isinstance(post_created["created_at"], datetime)
    assert post_created["created_at"].tzinfo is not None
    assert plain_text(env.admin, env.schema, 1, post_edited["text"]) == "edited #kafka"
    assert isinstance(post_edited["edited_at"], datetime)
    assert [str(e["_meta"]["event_id"]) for e in decoded] == event_ids
    assert [e["_meta"]["version"] for e in decoded] == [1, 2]
    assert [e["_meta"]["event_type"] for e in decoded] == ["PostCreated", "PostEdited"]
    assert decoded[0]["_meta"]["occurred_at"].tzinfo is not None
    # Record-name strategy: each event type is its own subject, registered before the append.
    ids = [struct.unpack(">I", (value or b"")[1:5])[0] for _, value, _ in records]
    assert [json.loads(registry.get_schema(i).schema_str or "") for i in ids] == [
        avro_schema(PostCreated),
        avro_schema(PostEdited),
    ]
    subjects = registry.get_subjects()
    assert {"io.tributary.events.PostCreated", "io.tributary.events.PostEdited"} <= set(subjects)
    # The store recorded each event's schema id when it was appended.
    with env.admin.connect() as conn:
        stored = conn.execute(
            text(f"SELECT schema_id FROM {env.schema}.events ORDER BY position")
        ).scalars()
        assert list(stored) == ids

    assert {key for key, _, _ in records} == {created.stream_id.encode()}
    assert [h["version"] for _, _, h in records] == [b"1", b"2"]
    assert [h["event_type"] for _, _, h in records] == [b"PostCreated", b"PostEdited"]
    admin = TopicAdmin(stack.kafka)
    configs = admin.configs("events.post")
    assert configs["cleanup.policy"] == "delete" and configs["retention.ms"] == "-1"
    assert f"cdc.{env.schema}.events" not in admin.topic_names()  # routed, not mirrored raw


def test_every_event_on_events_post_decodes_with_confluents_deserializer(
    stack: Endpoints,
    unique: str,
    env: StoreEnv,
    connector_factory: Factory,
) -> None:
    """Typed events (their schemas registered by the bus) and an untyped one (appended with no
    schema: the outbox's ``io.tributary.Event`` envelope), published by CDC to a topic of this
    test's own: every event appended is on it, and the plain client with
    ``schema.registry.url`` decodes every record."""
    bus = env.bus()
    created = bus.send(CreatePost(post_id=31, author_id=2, text="typed #avro"))
    edited = bus.send(EditPost(post_id=31, text="typed, edited"))
    assert isinstance(created, Accepted) and isinstance(edited, Accepted)
    untyped = NewEvent("PostPinned", {"post_id": 32, "pinned": True})
    env.store.append("post-32", [untyped], 0, stream_type="post")
    appended = {*created.event_ids, *edited.event_ids, str(untyped.event_id)}
    assert len(appended) == 3

    prefix = f"ev_{unique}."
    topic = f"{prefix}post"
    connector = connector_factory(
        [f"{env.schema}.events"],
        cdc_outbox_table=f"{env.schema}.events",
        event_topic_prefix=prefix,
    )
    connector.start()
    admin = TopicAdmin(stack.kafka)
    with contextlib.suppress(WaitTimeoutError):  # the assertion below names what is missing
        wait_until(
            lambda: topic in admin.topic_names() and len(read_topic(stack.kafka, topic)) >= 3,
            60,
            f"the events on {topic}",
            1,
        )
    records = read_topic(stack.kafka, topic) if topic in admin.topic_names() else []
    assert {(r.headers.get("event_id") or b"").decode() for r in records} == appended
    assert len(records) == len(appended)  # each once, nothing else

    deserialize = AvroDeserializer(SchemaRegistryClient({"url": stack.settings.registry_url}))
    context = SerializationContext(topic, MessageField.VALUE)
    decoded = {}
    for record in records:
        value = deserialize(record.value, context)
        assert isinstance(value, dict)
        meta = value.get("_meta", value)  # typed: the _meta envelope; untyped: flat
        assert str(meta["event_id"]).encode() == record.headers["event_id"]
        decoded[meta["event_type"]] = value
    created, edited = decoded["PostCreated"], decoded["PostEdited"]
    assert plain_text(env.admin, env.schema, created["author_id"], created["text"]) == "typed #avro"
    assert plain_text(env.admin, env.schema, edited["author_id"], edited["text"]) == "typed, edited"
    assert json.loads(decoded["PostPinned"]["data"]) == {"post_id": 32, "pinned": True}
