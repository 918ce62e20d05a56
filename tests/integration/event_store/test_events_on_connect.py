"""Same topics, embedded or on Kafka Connect: the outbox connector that `tributary
connector-config` exports publishes exactly the records the embedded outbox publishes.

The embedded connector (`tributary run cdc`) publishes the events to ``events.post``. Then a
Debezium engine runs in this process with the exported outbox connector's configuration as
is (only the embedded engine's offset store added): Debezium applies its transforms (the
filter and the ``EventRouter``), the test its key, value and header converters
(:mod:`tests.integration.connect_path`), as a Connect worker would.
Topic, key, value bytes and headers must be those of the embedded records.
"""

import io
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastavro import parse_schema, schemaless_writer
from sqlalchemy import text

from cdc.outbox import EventOutbox
from cdc.signals import ensure_signal_table
from cdc.slots import drop_publication, drop_slot
from connectors.debezium import OUTBOX_HEADERS, DebeziumPostgresConfig
from connectors.postgres import PostgresConfig
from connectors.schema_registry.client import RegistryClient
from examples.social.posts import CreatePost, EditPost, PostLiked, post_stream
from tests.integration.cdc_process import CdcProcess
from tests.integration.conftest import Endpoints
from tests.integration.connect_path import Record, run_connect_path
from tests.integration.event_store.conftest import StoreEnv
from tests.integration.kafka_reading import read_topic, wait_until

Factory = Callable[..., CdcProcess]


@pytest.fixture
def outbox_connector(
    stack: Endpoints, env: StoreEnv, unique: str
) -> Iterator[DebeziumPostgresConfig]:
    db = PostgresConfig(stack.database_url)
    config = DebeziumPostgresConfig(
        name=f"x{unique}",
        database=db,
        tables=(f"{env.schema}.events",),
        outbox_table=f"{env.schema}.events",
    )
    ensure_signal_table(db)  # the heartbeat table
    yield config
    slot = config.outbox_connector_properties()["slot.name"]
    drop_slot(db, slot)
    drop_publication(db, slot)


def test_the_exported_outbox_connector_publishes_what_the_embedded_outbox_publishes(
    stack: Endpoints,
    env: StoreEnv,
    outbox_connector: DebeziumPostgresConfig,
    connector_factory: Factory,
    tmp_path: Path,
) -> None:
    bus = env.bus()
    assert bus.send(CreatePost(7, 1, "hello #connect")).status == "accepted"
    assert bus.send(EditPost(7, "edited #connect")).status == "accepted"
    # Two events in one append (the store's array form), metadata with a non-ASCII letter.
    liked = [PostLiked(7, 1, u, datetime.now(UTC)) for u in (2, 3)]
    new = [bus.registry.codec.encode(e, {"by": "Zoë", "n": 1}) for e in liked]
    with env.app.begin() as conn:
        env.store.append(post_stream(7), new, 2, stream_type="post", connection=conn)
    rows = stored_rows(env)
    assert len(rows) == 4 and all(r["payload"] is not None for r in rows)
    ids = [str(r["event_id"]) for r in rows]

    # The store's payload is the value the outbox encoded in Python before the column existed.
    outbox = EventOutbox(RegistryClient(stack.settings.registry_url))
    for row in rows:
        without = {k: v for k, v in row.items() if k != "payload"}
        assert outbox.record(without, None).value == row["payload"]

    embedded = connector_factory([f"{env.schema}.events"], cdc_outbox_table=f"{env.schema}.events")
    embedded.start()

    def published() -> list[Record]:
        found = {
            (r.headers.get("event_id") or b"").decode(): ("events.post", r.key, r.value, r.headers)
            for r in read_topic(stack.kafka, "events.post")
        }
        return [found[i] for i in ids if i in found]

    wait_until(lambda: len(published()) == len(ids), 120, "the embedded events", 1)
    embedded_records = published()

    [exported] = [
        c
        for c in outbox_connector.kafka_connect_config(hide_password=False)
        if c["name"] == outbox_connector.outbox_connector_name
    ]
    config = exported["config"]
    assert isinstance(config, dict)
    connect_records = run_connect_path(config, tmp_path / "connect", lambda r: len(r) >= len(ids))

    assert [r[0] for r in connect_records] == ["events.post"] * len(ids)
    for (topic, key, value, headers), (e_topic, e_key, e_value, e_headers) in zip(
        connect_records, embedded_records, strict=True
    ):
        assert (topic, key, value) == (e_topic, e_key, e_value)
        assert {h: headers[h] for h in OUTBOX_HEADERS} == {h: e_headers[h] for h in OUTBOX_HEADERS}
        assert headers["id"] == headers["event_id"]  # EventRouter's own
        assert set(e_headers) - set(OUTBOX_HEADERS) == {"lsn"}  # the embedded one's own
    assert [r[3]["event_id"] for r in connect_records] == [i.encode() for i in ids]


def stored_rows(env: StoreEnv) -> list[dict[str, Any]]:
    """The events rows, columns as Debezium renders them to the outbox (JSON as text)."""
    with env.admin.connect() as conn:
        result = conn.execute(
            text(
                "SELECT event_id, event_type, schema_version, stream_type, stream_id, version,"
                " position, recorded_at, data::text AS data, metadata::text AS metadata,"
                f" schema_id, payload FROM {env.schema}.events ORDER BY position"
            )
        )
        return [dict(r._mapping) for r in result]


def test_the_stores_avro_long_is_avros_zigzag_varint(stack: Endpoints, env: StoreEnv) -> None:
    values = [0, 1, -1, 63, 64, -64, -65, 300, 2**27, 2**31, -(2**31), 2**48, 2**55 - 1]
    values += [2**55, -(2**55), 2**62, 2**63 - 1, -(2**63)]
    with psycopg.connect(stack.postgres_dsn) as conn:
        got = [
            conn.execute(f"SELECT {env.schema}.avro_long(%s::bigint)", (v,)).fetchone()
            for v in values
        ]
    expected = []
    for v in values:
        out = io.BytesIO()
        schemaless_writer(out, parse_schema("long"), v)
        expected.append((out.getvalue(),))
    assert got == expected
