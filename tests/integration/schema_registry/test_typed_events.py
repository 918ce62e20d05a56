"""Typed events against the session stack's registry, read by Confluent's own clients.

An event type evolves with a new optional field: readers with the old and the new schema
(Confluent's ``AvroDeserializer`` with a reader schema, and our SDK with an upcaster) decode
old and new records alike. A new required field without default is refused: 409 from the REST
API, and the command processor does not start with that event type, naming the field, so no
event of that version is ever appended."""

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from cdc.outbox import EventOutbox
from cdc.publisher import OutgoingChange
from connectors.schema_registry.client import RegistryClient
from connectors.subscriber import EventRecord, subscribe
from event_store import Event, EventCodec, EventRegistry, Upcasters
from event_store.codec import to_json
from event_store.schemas import EventSchemaError, avro_schema, register_event_schemas, subject_of
from event_store.subscription import PublishedEvent, domain_events
from tests.integration.conftest import Endpoints
from tests.integration.kafka_reading import read_topic
from tests.integration.schema_registry.evolving import rated_classes
from tests.integration.subscribe.conftest import GROUP_PROPERTIES, read_until
from tests.integration.subscribe.feed import produce

ROOT = Path(__file__).resolve().parents[3]
AT = datetime(2026, 3, 1, 12, 0, 0, 250000, tzinfo=UTC)


def _record(
    outbox: EventOutbox, event: Event, schema_id: int, version: int, topic_type: str
) -> OutgoingChange:
    row = {
        "event_id": str(uuid.uuid4()),
        "event_type": event.event_name,
        "schema_version": event.schema_version,
        "stream_type": topic_type,
        "stream_id": "rating-1",
        "version": version,
        "position": version,
        "recorded_at": AT.isoformat(),
        "data": json.dumps(to_json(event)),
        "metadata": "{}",
        "schema_id": schema_id,
    }
    return outbox.record(row, str(version).encode())


def _decode_all(deserialize: AvroDeserializer, topic: str, values: Sequence[bytes]) -> list[Any]:
    context = SerializationContext(topic, MessageField.VALUE)
    return [deserialize(value, context) for value in values]


def test_an_optional_field_old_and_new_readers_decode_old_and_new_records(
    stack: Endpoints, unique: str
) -> None:
    url = stack.settings.registry_url
    v1, v2, _ = rated_classes(f"io.tributary.test{unique}")
    ours = RegistryClient(url)
    outbox = EventOutbox(ours)
    old_id = register_event_schemas([v1], ours)[("Rated", 1)]
    old = _record(outbox, v1(1, 4, AT), old_id, 1, f"rating_{unique}")  # type: ignore[call-arg]
    new_id = register_event_schemas([v2], ours)[("Rated", 2)]  # accepted: BACKWARD-compatible
    assert new_id != old_id
    new = _record(outbox, v2(1, 5, AT, "great"), new_id, 2, f"rating_{unique}")  # type: ignore[call-arg]
    produce(stack.kafka, [old, new], partitions=1)
    topic = f"events.rating_{unique}"
    values = [r.value or b"" for r in read_topic(stack.kafka, topic)]
    assert len(values) == 2

    client = SchemaRegistryClient({"url": url})
    assert client.get_versions(subject_of(v1)) == [1, 2]
    as_written = _decode_all(AvroDeserializer(client), topic, values)
    assert [(r["post_id"], r["stars"], r["rated_at"]) for r in as_written] == [
        (1, 4, AT),
        (1, 5, AT),
    ]
    assert "comment" not in as_written[0] and as_written[1]["comment"] == "great"
    old_reader = AvroDeserializer(client, json.dumps(avro_schema(v1)))
    assert [(r["stars"], "comment" in r) for r in _decode_all(old_reader, topic, values)] == [
        (4, False),
        (5, False),
    ]
    new_reader = AvroDeserializer(client, json.dumps(avro_schema(v2)))
    assert [(r["stars"], r["comment"]) for r in _decode_all(new_reader, topic, values)] == [
        (4, None),
        (5, "great"),
    ]

    # Our SDK: the envelope as published, and the domain event of today's class (v1 upcast).
    upcasters = Upcasters()
    upcasters.register("Rated", 1, "Rated", 2)
    codec = EventCodec(EventRegistry([v2]), upcasters)
    with subscribe(
        [topic],
        None,
        kafka=stack.kafka,
        assign=True,
        schema_registry_url=url,
        event_decoder=domain_events(codec),
        properties=GROUP_PROPERTIES,
    ) as subscriber:
        got = read_until(subscriber, lambda out: len(out) >= 2, timeout=30)
    events = [d.value for d in got]
    assert all(isinstance(e, PublishedEvent) for e in events)
    typed = [e.event for e in events if isinstance(e, PublishedEvent)]
    assert typed == [v2(1, 4, AT, None), v2(1, 5, AT, "great")]  # type: ignore[call-arg]
    with subscribe(
        [topic], None, kafka=stack.kafka, assign=True, schema_registry_url=url
    ) as subscriber:
        plain = read_until(subscriber, lambda out: len(out) >= 2, timeout=30)
    records = [d.value for d in plain]
    assert all(isinstance(r, EventRecord) for r in records)
    assert [
        (r.schema_version, r.data.get("comment")) for r in records if isinstance(r, EventRecord)
    ] == [
        (1, None),
        (2, "great"),
    ]


def test_a_required_field_without_default_is_refused_and_the_processor_does_not_start(
    stack: Endpoints, unique: str, tmp_path: Path
) -> None:
    namespace = f"io.tributary.test{unique}"
    url = stack.settings.registry_url
    v1, v2, v3 = rated_classes(namespace)
    ours = RegistryClient(url)
    register_event_schemas([v1, v2], ours)

    answer = httpx.post(
        f"{url}/subjects/{subject_of(v3)}/versions",
        json={"schema": json.dumps(avro_schema(v3))},
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    assert answer.status_code == 409 and answer.json()["error_code"] == 409
    with pytest.raises(EventSchemaError, match="reviewer_id") as refused:
        register_event_schemas([v3], ours)
    assert "Rated v3" in str(refused.value)

    store = f"es_{unique}"
    env = {
        **os.environ,
        "TRIBUTARY_HOME": str(tmp_path / "home"),
        "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        **stack.settings.kafka_security_env(),  # SASL/TLS of a brought Kafka
        "TRIBUTARY_POSTGRES_URL": stack.database_url,
        "TRIBUTARY_SCHEMA_REGISTRY_URL": url,
        "TRIBUTARY_COMMAND_HANDLERS": "tests.integration.schema_registry.evolving:registry",
        "TRIBUTARY_EVENT_STORE_SCHEMA": store,
        "TRIBUTARY_COMMANDS_TOPIC": f"commands-{unique}",
        "TRIBUTARY_COMMAND_RESULTS_TOPIC": f"results-{unique}",
        "EVOLVING_NAMESPACE": namespace,
        "COLUMNS": "200",
    }
    done = subprocess.run(
        [sys.executable, "-m", "infra.cli", "run-commands"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = " ".join((done.stdout + done.stderr).split())
    assert done.returncode != 0, output
    assert "Rated v3" in output and "reviewer_id" in output, output
    # It stopped before it created anything: no store, so no event of v3 was ever appended.
    with psycopg.connect(stack.postgres_dsn) as conn:
        found = conn.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s", (store,)
        ).fetchone()
    assert found == (0,)
    assert SchemaRegistryClient({"url": url}).get_versions(subject_of(v3)) == [1, 2]
