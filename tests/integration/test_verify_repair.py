"""`verify` finds what the topics lack against the source of truth; `repair` restores it.

The losses are made by hand here (a broker that drops acknowledged records is what the chaos
harness does for real): a CDC topic that lacks rows, holds an old value and a deleted row; an
event topic that lacks events of the event store. Repair runs with the real connector, whose
incremental snapshot re-reads exactly the keys that were missing or stale.
"""

import json
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from sqlalchemy import text

from cdc.outbox import EventOutbox
from connectors.kafka import TopicAdmin, history_topic, state_topic
from connectors.postgres import make_engine
from connectors.schema_registry.client import RegistryClient
from event_store import EventStore, NewEvent, create_schema, drop_schema
from infra.settings import load_settings
from infra.verify import repair, verify
from tests.integration.cdc_process import CdcProcess
from tests.integration.conftest import Endpoints
from tests.integration.kafka_reading import read_topic, wait_until


def change(table: str, row: dict[str, Any], lsn: int, op: str = "c") -> bytes:
    schema, name = table.split(".")
    envelope = {
        "before": None,
        "after": row,
        "op": op,
        "source": {"lsn": lsn, "txId": 1, "schema": schema, "table": name},
    }
    return json.dumps(envelope).encode()


def test_verify_names_what_is_missing_and_repair_restores_it(
    stack: Endpoints, unique: str, connector_factory: Any, tmp_path: Path
) -> None:
    table, schema = f"public.vr_{unique}", f"es_{unique}"
    prefix, events = f"cdc_{unique}", f"ev_{unique}."
    s = load_settings(
        home=tmp_path,
        postgres_url=stack.database_url,
        **stack.kafka_settings,
        redis_url=stack.redis_url,
        cdc_tables=(table, f"{schema}.events"),
        cdc_outbox_table=f"{schema}.events",
        cdc_topic_prefix=prefix,
        event_topic_prefix=events,
        event_store_schema=schema,
        mirror_tables="",
        views="",
        schema_registry_url=stack.settings.registry_url,
    )
    engine = make_engine(s.postgres())
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {table} (id int PRIMARY KEY, v text NOT NULL)"))
        conn.execute(text(f"INSERT INTO {table} SELECT i, 'v' || i FROM generate_series(1, 12) i"))
        conn.execute(text(f"UPDATE {table} SET v = 'new' WHERE id = 5"))
        create_schema(conn, schema)
    store = EventStore(engine, schema)
    for n in range(1, 7):
        store.append(
            f"post-{n}",
            [NewEvent("PostCreated", {"post_id": n, "text": "x"})],
            0,
            stream_type="post",
        )
    topic = f"{prefix}.{table}"
    try:
        # The topics as a lossy broker left them: rows 11, 12 missing, row 5 old, row 13
        # deleted at the source but still on the topic; events of post-5 and post-6 missing.
        TopicAdmin(s.kafka()).ensure(state_topic(topic, 1))
        producer = Producer(s.kafka().client_properties(**{"partitioner": "murmur2_random"}))
        for i in [*range(1, 11), 13]:
            value = "v5" if i == 5 else f"v{i}"
            producer.produce(
                topic,
                key=json.dumps({"id": i}).encode(),
                value=change(table, {"id": i, "v": value}, 100 + i),
            )
        TopicAdmin(s.kafka()).ensure(history_topic(f"{events}post", 1))
        outbox = EventOutbox(RegistryClient(s.registry_url), events)
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    f"SELECT event_id, event_type, schema_version, stream_type, stream_id, version,"
                    f" position, recorded_at, data, metadata FROM {schema}.events"
                    " WHERE stream_id NOT IN ('post-5', 'post-6')"
                )
            ).fetchall()
        for r in rows:
            after = {
                "event_id": str(r[0]),
                "event_type": r[1],
                "schema_version": r[2],
                "stream_type": r[3],
                "stream_id": r[4],
                "version": r[5],
                "position": r[6],
                "recorded_at": r[7].isoformat(),
                "data": json.dumps(r[8]),
                "metadata": json.dumps(r[9]),
            }
            for out in outbox.route(
                json.dumps({"op": "c", "after": after, "source": {"lsn": 1}}), b"1"
            ):
                producer.produce(out.topic, key=out.key, value=out.value, headers=out.headers)
        assert producer.flush(30) == 0

        found = verify(s, views=False)
        [report] = found.tables
        assert not found.ok
        assert sorted(json.loads(k)["id"] for k in report.missing) == [11, 12]
        assert [json.loads(k)["id"] for k in report.stale] == [5]
        assert [json.loads(k)["id"] for k in report.extra] == [13]
        assert found.events is not None
        assert [(s_, v) for _, s_, v in found.events.missing] == [("post-5", 1), ("post-6", 1)]

        # Repair with the real connector running (it acts on the snapshot signal).
        cdc: CdcProcess = connector_factory(
            [table, f"{schema}.events"],
            cdc_topic_prefix=prefix,
            event_topic_prefix=events,
            cdc_outbox_table=f"{schema}.events",
            event_store_schema=schema,
            cdc_snapshot_mode="no_data",
        )
        cdc.start()
        cdc.wait_running()
        done = repair(s, found)
        assert done["events_republished"] == 2
        assert done["tables"][table]["snapshot_keys"] == 3
        assert done["tables"][table]["deletes_published"] == 1
        wait_until(
            lambda: verify(s, views=False).ok, 120, "the topics to match the source of truth"
        )
        again = verify(s, views=False)
        assert again.events is not None and again.events.missing == []

        # Each verify read only what the topics gained since the one before; --full reads all.
        assert (again.events.read, again.events.whole) == (0, False)
        assert (again.tables[0].read, again.tables[0].whole) == (0, False)
        store.append(
            "post-7", [NewEvent("PostCreated", {"post_id": 7, "text": "x"})], 0, stream_type="post"
        )
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE {table} SET v = 'newer' WHERE id = 1"))
        wait_until(
            lambda: (
                (r := verify(s, views=False)).ok and r.events is not None and r.events.events == 7
            ),
            120,
            "the new event and row change to be checked",
        )
        full = verify(s, views=False, full=True)
        assert full.ok and full.events is not None and full.events.whole
        assert full.events.read == len(read_topic(s.kafka(), f"{events}post"))
        assert (full.tables[0].read, full.tables[0].whole) == (
            len(read_topic(s.kafka(), topic)),
            True,
        )

        # A topic created again under its name is read whole: nothing read before is trusted.
        cdc.stop()
        admin = TopicAdmin(s.kafka())
        admin.delete(f"{events}post")
        wait_until(lambda: f"{events}post" not in admin.topic_names(), 30, "the topic deletion")
        admin.ensure(history_topic(f"{events}post", 1))
        producer.produce(out.topic, key=out.key, value=out.value, headers=out.headers)
        assert producer.flush(30) == 0  # one event again (the last one routed above)
        rewound = verify(s, views=False)
        assert rewound.events is not None and rewound.events.whole
        assert (rewound.events.events, len(rewound.events.missing)) == (7, 6)
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
            drop_schema(conn, schema)
        engine.dispose()
