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
    exported = config.kafka_connect_config()
    assert exported["name"] == "shop"
    body = exported["config"]
    assert isinstance(body, dict)
    assert body["database.password"] != "secret"
    assert "offset.storage" not in body
    assert (
        config.kafka_connect_config(hide_password=False)["config"]["database.password"] == "secret"
    )  # type: ignore[index]


def test_names_and_tables_are_validated() -> None:
    with pytest.raises(ValueError, match="slot"):
        DebeziumPostgresConfig(name="Bad-Name", database=DB, tables=())
    with pytest.raises(ValueError, match=r"schema\.table"):
        DebeziumPostgresConfig(name="ok", database=DB, tables=("orders",))
