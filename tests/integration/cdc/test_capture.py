"""Debezium captures PostgreSQL into compacted topics: order, envelope, snapshot, schema change,
clean stops, failures, and the slots left behind."""

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from cdc.slots import drop_publication, drop_slot, slot_info
from connectors.kafka import TopicAdmin, history_topic
from connectors.postgres import PostgresConfig
from tests.integration.cdc.conftest import changes_on, sql, topic_length
from tests.integration.cdc_process import CdcProcess
from tests.integration.conftest import Endpoints
from tests.integration.kafka_reading import read_topic, wait_until
from tests.jvm import CDC_CLASS_ARCHIVE, CDC_JAVA_OPTIONS

Factory = Callable[..., CdcProcess]


def _running_on_new_table(stack: Endpoints, connector_factory: Factory, table: str) -> CdcProcess:
    """A new table ``(id bigint PRIMARY KEY, body text)`` and a running connector capturing it."""
    sql(stack, f"CREATE TABLE {table} (id bigint PRIMARY KEY, body text)")
    connector = connector_factory([f"public.{table}"])
    connector.start()
    connector.wait_running()
    return connector


@pytest.mark.parametrize("publisher", ["jvm", "python"])
def test_changes_arrive_in_order_with_envelope_tombstone_and_key(
    stack: Endpoints, unique: str, connector_factory: Factory, publisher: str
) -> None:
    """Both publishers (Kafka's Java producer in the engine's JVM, and Python's) give the same
    records: keys, envelopes, order, tombstones with their delete's LSN, headers."""
    table = f"orders_{publisher}_{unique}"
    topic = f"cdc.public.{table}"
    sql(
        stack,
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, item text, qty int)",
        f"INSERT INTO {table} VALUES (1, 'pen', 1), (2, 'ink', 2)",
    )
    connector = connector_factory([f"public.{table}"], cdc_publisher=publisher)
    connector.start()
    wait_until(lambda: topic_length(stack, topic) >= 2, 120, "the snapshot rows")
    assert connector.status()["publisher"] == publisher

    sql(
        stack,
        f"INSERT INTO {table} VALUES (3, 'pad', 3)",
        f"UPDATE {table} SET qty = 30 WHERE id = 3",
        f"DELETE FROM {table} WHERE id = 1",
        f"ALTER TABLE {table} ADD COLUMN note text",
        f"INSERT INTO {table} VALUES (4, 'cap', 4, 'new column')",
    )
    wait_until(lambda: topic_length(stack, topic) >= 7, 60, "the streamed changes")
    changes = changes_on(stack, topic)

    assert [(c.op, c.key) for c in changes] == [
        ("r", {"id": 1}),
        ("r", {"id": 2}),
        ("c", {"id": 3}),
        ("u", {"id": 3}),
        ("d", {"id": 1}),
        (None, {"id": 1}),  # the tombstone right after the delete
        ("c", {"id": 4}),
    ]
    assert changes[0].after == {"id": 1, "item": "pen", "qty": 1}
    assert changes[0].source is not None and changes[0].source.snapshot
    assert changes[3].after == {"id": 3, "item": "pad", "qty": 30}
    assert changes[4].before == {"id": 1, "item": None, "qty": None}  # default replica identity
    assert changes[6].after == {"id": 4, "item": "cap", "qty": 4, "note": "new column"}
    for change in changes:
        assert change.source is not None
        assert change.source.table == table or change.is_tombstone
    streamed = [c.position for c in changes[2:]]
    assert streamed == sorted(streamed) and streamed[0] > changes[0].position
    assert changes[5].position == changes[4].position  # the tombstone carries its delete's LSN
    raw = read_topic(stack.kafka, topic)
    assert raw[2].headers["lsn"] == str(changes[2].position).encode()
    assert (
        raw[2].headers["txId"] == str(changes[2].source.tx_id if changes[2].source else "").encode()
    )
    assert json.loads(raw[2].key or b"") == {"id": 3}
    assert TopicAdmin(stack.kafka).configs(topic)["cleanup.policy"] == "compact"


def test_sigterm_commits_so_a_restart_redelivers_nothing(
    stack: Endpoints, unique: str, connector_factory: Factory
) -> None:
    table = f"notes_{unique}"
    topic = f"cdc.public.{table}"
    connector = _running_on_new_table(stack, connector_factory, table)
    sql(stack, f"INSERT INTO {table} SELECT g, 'n' || g FROM generate_series(1, 500) g")
    wait_until(lambda: topic_length(stack, topic) >= 500, 60, "500 changes")
    assert connector.terminate() == 0, connector.output()
    assert connector.status()["state"] == "stopped", connector.output()
    assert "stopped cleanly" in connector.output()

    connector.start()
    connector.wait_running()
    sql(stack, f"INSERT INTO {table} VALUES (501, 'after restart')")
    wait_until(lambda: topic_length(stack, topic) >= 501, 60, "the change after the restart")
    keys = [json.loads(r.key or b"")["id"] for r in read_topic(stack.kafka, topic)]
    twice = sorted(k for k, n in Counter(keys).items() if n > 1)
    missing = sorted(set(range(1, 502)) - set(keys))
    detail = f"twice: {twice[:20]}, missing: {missing[:20]}\n{connector.output()}"
    assert keys == list(range(1, 502)), detail  # nothing delivered twice, nothing lost


def test_a_publish_failure_stops_the_connector_and_skips_nothing(
    stack: Endpoints, unique: str, connector_factory: Factory
) -> None:
    table = f"bad_{unique}"
    topic = f"cdc.public.{table}"
    sql(
        stack,
        f"CREATE TABLE {table} (id bigint PRIMARY KEY)",
        f"INSERT INTO {table} SELECT generate_series(1, 50)",
    )
    admin = TopicAdmin(stack.kafka)
    admin.ensure(history_topic(topic))  # not compacted: the connector must refuse it
    connector = connector_factory([f"public.{table}"])
    connector.start()
    assert connector.wait_exit() != 0
    output = connector.output()
    assert topic in output and "cleanup.policy" in output
    assert connector.status()["state"] == "failed"

    admin.delete(topic)
    wait_until(lambda: topic not in admin.topic_names(), 30, "the topic deletion")
    connector.start()
    wait_until(lambda: topic_length(stack, topic) >= 50, 120, "the snapshot after the fix")
    keys = sorted(json.loads(r.key or b"")["id"] for r in read_topic(stack.kafka, topic))
    assert keys == list(range(1, 51))


def test_status_and_connector_config_and_slot_cleanup(
    stack: Endpoints, unique: str, connector_factory: Factory, tmp_path: Path
) -> None:
    """Also: the engine's JVM maps its classes from the archive `make setup` wrote
    (``-Xshare:on``: a JVM that cannot map it does not start at all)."""
    assert CDC_CLASS_ARCHIVE.is_file(), f"{CDC_CLASS_ARCHIVE} is missing: run `make setup`"
    loaded = tmp_path / "classes.log"
    table = f"stat_{unique}"
    sql(stack, f"CREATE TABLE {table} (id bigint PRIMARY KEY)")
    connector = connector_factory(
        [f"public.{table}"],
        cdc_java_options=f"{CDC_JAVA_OPTIONS} -Xshare:on -Xlog:class+load=info:file={loaded}",
    )
    connector.start()
    connector.wait_running()
    sql(stack, f"INSERT INTO {table} VALUES (1)")
    wait_until(lambda: topic_length(stack, f"cdc.public.{table}") >= 1, 60, "the change")

    def cli(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "infra.cli", *args],
            env=connector.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout

    status = json.loads(cli("cdc-status", "--json"))
    assert status["state"] == "running"
    assert status["publisher"] == "jvm"  # the default, with the JDK that `make setup` installs
    assert status["slot"] == f"tributary_{connector.name}"
    assert status["slot_active"] is True
    assert isinstance(status["retained_wal_bytes"], int) and status["retained_wal_bytes"] >= 0
    assert isinstance(status["last_change_at"], float)

    [exported] = json.loads(cli("connector-config"))  # no outbox captured: one connector
    assert exported["name"] == connector.name
    config = exported["config"]
    assert config["connector.class"] == "io.debezium.connector.postgresql.PostgresConnector"
    assert config["plugin.name"] == "pgoutput"
    assert config["slot.name"] == f"tributary_{connector.name}"
    assert config["publication.autocreate.mode"] == "filtered"
    assert f"public\\.{table}" in config["table.include.list"]
    assert "offset.storage" not in config  # embedded-engine only

    assert connector.terminate() == 0, connector.output()
    db = PostgresConfig(stack.database_url)
    assert slot_info(db, f"tributary_{connector.name}") is not None
    assert drop_slot(db, f"tributary_{connector.name}") is True
    drop_publication(db, f"tributary_{connector.name}")
    assert slot_info(db, f"tributary_{connector.name}") is None
    with psycopg.connect(stack.postgres_dsn) as conn:
        pubs = conn.execute(
            "SELECT count(*) FROM pg_publication WHERE pubname = %s",
            (f"tributary_{connector.name}",),
        ).fetchone()
    assert pubs == (0,)
    # The engine's classes (Debezium, Kafka's, PostgreSQL's driver) from its jars or the archive
    engine = [
        line
        for line in loaded.read_text().splitlines()
        if any(f" {package}" in line for package in ENGINE_PACKAGES)
        and ("source: jar:" in line or "source: file:" in line or "shared objects file" in line)
    ]
    from_archive = [line for line in engine if "shared objects file" in line]
    assert len(from_archive) > 2000, (len(from_archive), len(engine))
    assert len(from_archive) > 0.9 * len(engine), (len(from_archive), len(engine))


ENGINE_PACKAGES = ("io.debezium.", "org.apache.kafka.", "org.postgresql.")


def test_replica_identity_full_gives_whole_before_images(
    stack: Endpoints, unique: str, connector_factory: Factory
) -> None:
    table = f"full_{unique}"
    topic = f"cdc.public.{table}"
    sql(
        stack,
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, item text, qty int)",
        f"INSERT INTO {table} VALUES (1, 'pen', 1)",
    )
    connector = connector_factory([f"public.{table}"], cdc_replica_identity_full=f"public.{table}")
    connector.start()
    wait_until(lambda: topic_length(stack, topic) >= 1, 120, "the snapshot row")
    sql(stack, f"UPDATE {table} SET qty = 2 WHERE id = 1", f"DELETE FROM {table} WHERE id = 1")
    wait_until(lambda: topic_length(stack, topic) >= 4, 60, "the update, delete and tombstone")
    update, delete = changes_on(stack, topic)[1:3]
    assert (update.op, update.before) == ("u", {"id": 1, "item": "pen", "qty": 1})
    assert (delete.op, delete.before) == ("d", {"id": 1, "item": "pen", "qty": 2})


def test_a_change_kafka_refuses_stops_the_connector_with_the_reason(
    stack: Endpoints, unique: str, connector_factory: Factory
) -> None:
    """A change larger than the Java producer's request limit (1 MB) is refused by Kafka's
    client: the connector stops with that reason, and the offsets it commits are those before
    the refused batch (a restart reads it again, and stops again, rather than skip it)."""
    table = f"big_{unique}"
    topic = f"cdc.public.{table}"
    connector = _running_on_new_table(stack, connector_factory, table)
    sql(stack, f"INSERT INTO {table} VALUES (1, 'small')")
    wait_until(lambda: topic_length(stack, topic) >= 1, 60, "the first change")
    sql(stack, f"INSERT INTO {table} VALUES (2, repeat('x', 2000000))")
    assert connector.wait_exit() != 0
    status = connector.status()
    assert status["state"] == "failed"
    assert "RecordTooLargeException" in str(status["error"])
    assert "RecordTooLargeException" in connector.output()
    connector.start()  # the refused change comes again: never skipped
    assert connector.wait_exit() != 0
    assert "RecordTooLargeException" in str(connector.status()["error"])
    assert [json.loads(r.key or b"")["id"] for r in read_topic(stack.kafka, topic)] == [1]
