from pathlib import Path

import pytest

from connectors.debezium import DebeziumPostgresConfig
from connectors.postgres import PostgresConfig

DB = PostgresConfig("postgresql+psycopg://app:secret@db.internal:5433/shop")


def test_embedded_properties_name_slot_publication_and_tables() -> None:
    config = DebeziumPostgresConfig(
        name="shop", database=DB, tables=("public.orders",), offsets_file=Path("/x/o.offsets")
    )
    props = config.embedded_properties()
    assert props["connector.class"] == "io.debezium.connector.postgresql.PostgresConnector"
    assert props["plugin.name"] == "pgoutput"
    assert props["slot.name"] == props["publication.name"] == "tributary_shop"
    assert props["publication.autocreate.mode"] == "filtered"
    assert props["table.include.list"] == (
        "public\\.orders,tributary_cdc\\.debezium_signal,tributary_cdc\\.heartbeat"
    )
    assert props["database.hostname"] == "db.internal"
    assert props["database.port"] == "5433"
    assert props["database.dbname"] == "shop"
    assert props["snapshot.mode"] == "initial"
    assert props["offset.storage.file.filename"] == "/x/o.offsets"
    assert props["offset.flush.interval.ms"] == "0"
    assert "tributary_cdc.heartbeat" in props["heartbeat.action.query"]
    assert props["signal.data.collection"] == "tributary_cdc.debezium_signal"


def test_kafka_connect_export_hides_the_password_and_embedded_settings() -> None:
    config = DebeziumPostgresConfig(name="shop", database=DB, tables=("public.orders",))
    [exported] = config.kafka_connect_config()  # the outbox is not captured: one connector
    assert exported["name"] == "shop"
    body = exported["config"]
    assert isinstance(body, dict)
    assert body["database.password"] != "secret"
    assert "offset.storage" not in body
    [shown] = config.kafka_connect_config(hide_password=False)
    assert shown["config"]["database.password"] == "secret"  # type: ignore[index]


def test_kafka_connect_export_has_an_outbox_connector_with_the_event_router() -> None:
    config = DebeziumPostgresConfig(
        name="shop",
        database=DB,
        tables=("public.orders", "event_store.events"),
        event_topic_prefix="prod.events.",
    )
    tables, outbox = config.kafka_connect_config()
    assert (tables["name"], outbox["name"]) == ("shop", "shop_outbox")
    body, routed = tables["config"], outbox["config"]
    assert isinstance(body, dict) and isinstance(routed, dict)
    assert "event_store" not in body["table.include.list"]
    assert body["transforms"] == "internal"  # signals and heartbeats are not published
    assert body["predicates.isInternal.pattern"] == (
        "cdc\\.tributary_cdc\\.debezium_signal|cdc\\.tributary_cdc\\.heartbeat"
    )
    assert body["topic.creation.default.cleanup.policy"] == "compact"
    assert routed["topic.creation.default.cleanup.policy"] == "delete"
    assert routed["topic.creation.default.retention.ms"] == "-1"
    assert routed["database.password"] != "secret"
    assert routed["slot.name"] == routed["publication.name"] == "tributary_shop_outbox"
    assert routed["table.include.list"] == "event_store\\.events,tributary_cdc\\.heartbeat"
    assert routed["transforms"] == "events,outbox"
    assert routed["predicates.isEvents.pattern"] == "cdc\\.event_store\\.events"
    assert routed["transforms.outbox.type"] == "io.debezium.transforms.outbox.EventRouter"
    assert routed["transforms.outbox.route.topic.replacement"] == "prod.events.${routedByValue}"
    assert routed["transforms.outbox.table.field.event.payload"] == "payload"
    assert routed["transforms.outbox.table.field.event.key"] == "stream_id"
    assert routed["transforms.outbox.table.fields.additional.placement"] == (
        "event_type:header:event_type,event_id:header:event_id,version:header:version,"
        "schema_version:header:schema_version,position:header:position"
    )
    assert routed["value.converter"] == "org.apache.kafka.connect.converters.ByteArrayConverter"
    assert routed["key.converter"] == "org.apache.kafka.connect.storage.StringConverter"
    assert "'shop_outbox'" in routed["heartbeat.action.query"]
    assert "signal.data.collection" not in routed


def test_only_the_outbox_connector_when_only_the_event_store_is_captured() -> None:
    config = DebeziumPostgresConfig(name="es", database=DB, tables=("event_store.events",))
    assert [c["name"] for c in config.kafka_connect_config()] == ["es_outbox"]
    no_outbox = DebeziumPostgresConfig(name="es", database=DB, tables=("public.orders",))
    with pytest.raises(ValueError, match="outbox"):
        no_outbox.outbox_connector_properties()


def test_names_and_tables_are_validated() -> None:
    with pytest.raises(ValueError, match="slot"):
        DebeziumPostgresConfig(name="Bad-Name", database=DB, tables=())
    with pytest.raises(ValueError, match=r"schema\.table"):
        DebeziumPostgresConfig(name="ok", database=DB, tables=("orders",))
