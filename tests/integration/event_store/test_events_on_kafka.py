"""End to end: a command on the `commands` topic -> its result on `command-results` -> its
events on `events.<stream_type>` through CDC of the events table (no dual write), Avro-decoded
with the schema found in `_tributary_fingerprints`."""

import json
import threading
from collections.abc import Callable

from cdc.outbox import EVENT_SCHEMA
from connectors.avro import FINGERPRINTS_TOPIC, SchemaCatalog
from connectors.kafka import TopicAdmin
from event_store.command import Accepted
from event_store.command_topic import CommandClient, CommandProcessor, CommandTopics, ensure_topics
from tests.integration.cdc_process import CdcProcess
from tests.integration.conftest import Endpoints
from tests.integration.event_store.conftest import StoreEnv
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
    catalog = SchemaCatalog()
    for record in read_topic(stack.kafka, FINGERPRINTS_TOPIC):
        catalog.add_record(record.key, record.value)
    decoded = [catalog.decode(value or b"") for _, value, _ in records]

    assert [str(e["event_id"]) for e in decoded] == event_ids
    assert [e["version"] for e in decoded] == [1, 2]
    assert {key for key, _, _ in records} == {created.stream_id.encode()}
    assert decoded[0]["event_type"] == "PostCreated"
    assert json.loads(decoded[0]["data"])["hashtags"] == ["kafka", "cdc"]
    assert decoded[0]["occurred_at"].tzinfo is not None
    assert [h["version"] for _, _, h in records] == [b"1", b"2"]
    assert [h["event_type"] for _, _, h in records] == [b"PostCreated", b"PostEdited"]
    admin = TopicAdmin(stack.kafka)
    configs = admin.configs("events.post")
    assert configs["cleanup.policy"] == "delete" and configs["retention.ms"] == "-1"
    assert admin.configs(FINGERPRINTS_TOPIC)["cleanup.policy"] == "compact"
    schema_keys = {r.key for r in read_topic(stack.kafka, FINGERPRINTS_TOPIC)}
    assert EVENT_SCHEMA.key.encode() in schema_keys
    assert f"cdc.{env.schema}.events" not in admin.topic_names()  # routed, not mirrored raw
