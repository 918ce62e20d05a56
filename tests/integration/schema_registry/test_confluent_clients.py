"""Confluent's own clients against our registry, stored on a real broker's compacted topic.

Each test runs a registry in this process on a topic of its own (the session stack runs the
stack's registry on ``_schemas``; one test checks that one answers too)."""

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from connectors.kafka import TopicAdmin, state_topic
from connectors.kafka.reading import read_topic
from connectors.schema_registry import store as store_module
from connectors.schema_registry.client import CONTENT_TYPE
from connectors.schema_registry.records import RegistryState
from connectors.schema_registry.store import KafkaSchemaLog, open_registry
from tests.integration.conftest import Endpoints
from tests.integration.schema_registry.serving import RunningRegistry

POST_V1 = {
    "type": "record",
    "name": "Post",
    "namespace": "io.tributary.test",
    "fields": [{"name": "id", "type": "string"}, {"name": "likes", "type": "int"}],
}
POST_V2_OPTIONAL = {
    **POST_V1,
    "fields": [*POST_V1["fields"], {"name": "title", "type": ["null", "string"], "default": None}],
}
POST_V2_REQUIRED = {**POST_V1, "fields": [*POST_V1["fields"], {"name": "author", "type": "string"}]}


@pytest.fixture
def registry_topic(stack: Endpoints, unique: str) -> Iterator[str]:
    topic = f"_schemas_test_{unique}"
    yield topic
    TopicAdmin(stack.kafka).delete(topic)


@pytest.fixture
def start_registry(
    stack: Endpoints, registry_topic: str
) -> Iterator[Callable[[], RunningRegistry]]:
    running: list[RunningRegistry] = []

    def start() -> RunningRegistry:
        running.append(RunningRegistry(stack.kafka, registry_topic))
        return running[-1]

    yield start
    for registry in running:
        registry.stop()


def avro(definition: dict[str, Any]) -> Schema:
    return Schema(json.dumps(definition), "AVRO")


def test_the_confluent_client_registers_reads_looks_up_and_checks(
    start_registry: Callable[[], RunningRegistry], unique: str
) -> None:
    url = start_registry().url
    client = SchemaRegistryClient({"url": url})
    subject = f"posts-{unique}-value"
    schema_id = client.register_schema(subject, avro(POST_V1))
    assert client.register_schema(subject, avro(POST_V1)) == schema_id

    fresh = SchemaRegistryClient({"url": url})  # no cache: every answer comes from the server
    assert json.loads(fresh.get_schema(schema_id).schema_str or "") == POST_V1
    latest = fresh.get_latest_version(subject)
    assert (latest.version, latest.schema_id, latest.subject) == (1, schema_id, subject)
    found = fresh.lookup_schema(subject, avro(POST_V1))
    assert (found.version, found.schema_id) == (1, schema_id)
    assert subject in fresh.get_subjects()
    assert fresh.get_versions(subject) == [1]
    assert [(v.subject, v.version) for v in fresh.get_schema_versions(schema_id)] == [(subject, 1)]

    assert fresh.test_compatibility(subject, avro(POST_V2_OPTIONAL)) is True
    assert fresh.test_compatibility(subject, avro(POST_V2_REQUIRED)) is False
    with pytest.raises(SchemaRegistryError) as refused:
        fresh.register_schema(subject, avro(POST_V2_REQUIRED))
    assert refused.value.http_status_code == 409 and refused.value.error_code == 409

    answer: Any = fresh.set_compatibility(subject, "FULL")  # the client returns the JSON body
    assert answer == {"compatibility": "FULL"}
    assert fresh.get_compatibility(subject) == "FULL"
    assert fresh.get_config(subject).compatibility_level.value == "FULL"  # type: ignore[union-attr]
    second = fresh.register_schema(subject, avro(POST_V2_OPTIONAL))
    assert second > schema_id
    with pytest.raises(SchemaRegistryError) as missing:
        fresh.get_version(subject, 9)
    assert missing.value.error_code == 40402
    assert fresh.delete_version(subject, 2) == 2
    assert fresh.delete_subject(subject) == [1]
    assert fresh.delete_subject(subject, permanent=True) == [1, 2]
    with pytest.raises(SchemaRegistryError) as gone:
        fresh.get_versions(subject)
    assert gone.value.error_code == 40401


def test_avro_serializer_registers_and_deserializer_decodes(
    stack: Endpoints, start_registry: Callable[[], RunningRegistry], unique: str
) -> None:
    url = start_registry().url
    topic = f"sr-posts-{unique}"
    client = SchemaRegistryClient({"url": url})
    serializer = AvroSerializer(client, json.dumps(POST_V2_OPTIONAL))
    producer = Producer(stack.kafka.client_properties())
    post = {"id": "p-1", "likes": 3, "title": "hello"}
    value = serializer(post, SerializationContext(topic, MessageField.VALUE))
    assert value is not None
    producer.produce(topic, key=b"p-1", value=value)
    assert producer.flush(15) == 0
    try:
        [record] = read_topic(stack.kafka, topic)
        assert record.value is not None and record.value[0] == 0  # Confluent wire format
        schema_id = int.from_bytes(record.value[1:5], "big")
        registered = SchemaRegistryClient({"url": url}).get_latest_version(f"{topic}-value")
        assert registered.schema_id == schema_id

        reader = AvroDeserializer(SchemaRegistryClient({"url": url}))
        decoded = reader(record.value, SerializationContext(topic, MessageField.VALUE))
        assert decoded == post
        # An old reader (version 1's schema) reads the new record too.
        old_reader = AvroDeserializer(SchemaRegistryClient({"url": url}), json.dumps(POST_V1))
        assert old_reader(record.value, SerializationContext(topic, MessageField.VALUE)) == {
            "id": "p-1",
            "likes": 3,
        }
    finally:
        TopicAdmin(stack.kafka).delete(topic)


def test_an_incompatible_version_is_409_over_rest(
    start_registry: Callable[[], RunningRegistry], unique: str
) -> None:
    url = start_registry().url
    subject = f"posts-{unique}-value"
    headers = {"Content-Type": CONTENT_TYPE}
    body = {"schema": json.dumps(POST_V1)}
    first = httpx.post(f"{url}/subjects/{subject}/versions", json=body, headers=headers)
    assert first.status_code == 200
    refused = httpx.post(
        f"{url}/subjects/{subject}/versions",
        json={"schema": json.dumps(POST_V2_REQUIRED)},
        headers=headers,
    )
    assert refused.status_code == 409
    assert refused.headers["content-type"] == CONTENT_TYPE
    error = refused.json()
    assert error["error_code"] == 409
    assert "author" in error["message"] and "READER_FIELD_MISSING_DEFAULT_VALUE" in error["message"]
    assert httpx.get(f"{url}/subjects/{subject}/versions").json() == [1]


def test_the_store_survives_a_registry_restart(
    stack: Endpoints,
    start_registry: Callable[[], RunningRegistry],
    registry_topic: str,
    unique: str,
) -> None:
    first = start_registry()
    client = SchemaRegistryClient({"url": first.url})
    ids = {
        f"a-{unique}": client.register_schema(f"a-{unique}", avro(POST_V1)),
        f"b-{unique}": client.register_schema(f"b-{unique}", avro(POST_V2_REQUIRED)),
    }
    client.set_compatibility(f"a-{unique}", "FORWARD")
    first.stop()

    second = start_registry()
    again = SchemaRegistryClient({"url": second.url})
    assert sorted(again.get_subjects()) == sorted(ids)
    for subject, schema_id in ids.items():
        assert again.get_latest_version(subject).schema_id == schema_id
    assert again.get_compatibility(f"a-{unique}") == "FORWARD"
    new_id = again.register_schema(
        f"c-{unique}", avro({"type": "enum", "name": "E", "symbols": ["A"]})
    )
    assert new_id > max(ids.values())

    # The topic holds Confluent's records: compacted, keys and values as Confluent writes them.
    assert TopicAdmin(stack.kafka).configs(registry_topic)["cleanup.policy"] == "compact"
    keys = [json.loads(r.key or b"") for r in read_topic(stack.kafka, registry_topic)]
    assert {"keytype": "SCHEMA", "subject": f"a-{unique}", "version": 1, "magic": 1} in keys
    assert {"keytype": "CONFIG", "subject": f"a-{unique}", "magic": 0} in keys


def test_the_cli_lists_shows_and_checks(
    start_registry: Callable[[], RunningRegistry], unique: str, tmp_path: Path
) -> None:
    url = start_registry().url
    subject = f"posts-{unique}-value"
    SchemaRegistryClient({"url": url}).register_schema(subject, avro(POST_V1))
    env = {**os.environ, "TRIBUTARY_SCHEMA_REGISTRY_URL": url}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "infra.cli", "schemas", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    listed = cli("--json")
    assert listed.returncode == 0, listed.stderr
    [row] = [r for r in json.loads(listed.stdout) if r["subject"] == subject]
    assert row["version"] == 1 and row["compatibility"] == "BACKWARD"
    shown = cli("show", subject, "--version", "1", "--json")
    assert json.loads(json.loads(shown.stdout)["schema"]) == POST_V1

    good, bad = tmp_path / "good.avsc", tmp_path / "bad.avsc"
    good.write_text(json.dumps(POST_V2_OPTIONAL))
    bad.write_text(json.dumps(POST_V2_REQUIRED))
    accepted = cli("check", subject, str(good))
    assert accepted.returncode == 0 and "compatible" in accepted.stdout
    refused = cli("check", subject, str(bad), "--json")
    assert refused.returncode == 1
    verdict = json.loads(refused.stdout)
    assert verdict["compatible"] is False
    assert any("author" in m for m in verdict["messages"])


def test_the_stack_runs_a_registry_on_its_own_port(stack: Endpoints) -> None:
    started = stack.local or stack.own  # on a brought Kafka, the session still runs its own
    if started is None or started.registry is None:
        pytest.skip("the session uses a registry named in the environment")
    [row] = [c for c in started.status() if c.name == "schema-registry"]
    assert row.state == "up" and row.pid is not None
    assert row.endpoint == stack.settings.registry_url
    assert httpx.get(f"{row.endpoint}/config").json() == {"compatibilityLevel": "BACKWARD"}


def test_store_reads_past_foreign_records(stack: Endpoints, registry_topic: str) -> None:
    """Records of another format on the topic (the old fingerprints) are skipped, not fatal."""
    TopicAdmin(stack.kafka).ensure(state_topic(registry_topic, 1))
    producer = Producer(stack.kafka.client_properties())
    producer.produce(registry_topic, key=b"0123456789abcdef", value=b'{"type":"string"}')
    producer.flush(10)
    registry, store = open_registry(stack.kafka, registry_topic)
    try:
        assert registry.subject_names() == [] and registry.state.skipped == 1
        assert isinstance(store, KafkaSchemaLog) and store.applied_offset >= 2
    finally:
        store.close()


def test_many_concurrent_registrations_all_land(
    start_registry: Callable[[], RunningRegistry], unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 clients register 4 subjects each at once: every write is a batch of its own on the
    store's topic, and the registry's reader must keep reading past them (on Tansu a short
    fetch wait stopped bringing records, and every later request timed out). The reader starts
    with a 1 ms wait so a stall comes early and its longer waits carry it on."""
    monkeypatch.setattr(store_module, "TAIL_FETCH_WAIT_MS", 1)
    running = start_registry()
    url = running.url
    subjects = [f"load-{unique}-{c}-{n}" for c in range(16) for n in range(4)]
    ids: dict[str, int] = {}

    def client(c: int) -> None:
        registry = SchemaRegistryClient({"url": url, "timeout": 60})
        for n in range(4):
            subject = f"load-{unique}-{c}-{n}"
            ids[subject] = registry.register_schema(subject, avro({**POST_V1, "name": f"P{c}x{n}"}))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert sorted(ids) == sorted(subjects)
    assert len(set(ids.values())) == len(subjects)  # distinct schemas, distinct ids
    fresh = SchemaRegistryClient({"url": url})
    assert set(subjects) <= set(fresh.get_subjects())
    for subject in subjects[::16]:
        assert fresh.get_latest_version(subject).schema_id == ids[subject]


def test_a_lengthened_fetch_wait_steps_back_down_and_an_idle_reader_answers_writes_quickly(
    stack: Endpoints, registry_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Tansu every write waits about the reader's fetch wait for its own record, so a wait
    lengthened under load must not stay: once the reader is caught up and the hold is over it
    tries shorter waits, down to the short one. Without writers it tails with the long idle
    wait; writes then answer in well under a second. (The rules, including the wake-up of an
    idle reader by a writer, are unit-tested: ``tests/unit/connectors/test_tail_wait.py``.)"""
    monkeypatch.setattr(store_module, "STEP_DOWN_AFTER_S", 0.5)
    monkeypatch.setattr(store_module, "IDLE_AFTER_S", 0.5)
    store = KafkaSchemaLog(stack.kafka, RegistryState(), registry_topic, fetch_wait_ms=2_000)
    store.start()  # a reader that lengthened its wait to 2 s under load
    try:
        deadline = time.monotonic() + 30
        while (store.tail.writers_ms, store.tail.reading_ms) != (
            store_module.TAIL_FETCH_WAIT_MS,
            store_module.IDLE_FETCH_WAIT_MS,
        ):
            assert time.monotonic() < deadline, store.tail
            time.sleep(0.1)
        for _ in range(3):
            started = time.monotonic()
            store.sync()  # a write, read back by the reader
            assert time.monotonic() - started < 1.0
    finally:
        store.close()
