"""Crash safety by crashing (kill -9 mid-burst), and incremental snapshots under writes."""

import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable

import psycopg

from tests.integration.cdc.conftest import changes_on, sql, topic_length
from tests.integration.cdc_process import CdcProcess
from tests.integration.conftest import Endpoints
from tests.integration.kafka_reading import read_topic, wait_until
from tributary.changes import ChangeEvent

Factory = Callable[..., CdcProcess]


def _apply_with_guard(changes: list[ChangeEvent]) -> tuple[dict[int, dict[str, object]], int]:
    """Fold changes into rows the way every sink does: ignore a position at or below the last
    applied one for its key. Returns the rows and how many records the guard removed."""
    last: dict[int, int] = {}
    rows: dict[int, dict[str, object]] = {}
    removed = 0
    for change in changes:
        key = int(change.key["id"])
        if key in last and change.position <= last[key]:
            removed += 1
            continue
        last[key] = change.position
        if change.is_delete:
            rows.pop(key, None)
        elif change.after is not None:
            rows[key] = change.after
    return rows, removed


def _table_rows(stack: Endpoints, table: str) -> dict[int, dict[str, object]]:
    with psycopg.connect(stack.postgres_dsn) as conn:
        cur = conn.execute(f"SELECT id, body FROM {table}")  # type: ignore[arg-type]
        return {row[0]: {"id": row[0], "body": row[1]} for row in cur.fetchall()}


def test_kill9_mid_burst_loses_nothing_and_duplicates_are_guarded(
    stack: Endpoints, unique: str, connector_factory: Factory
) -> None:
    table = f"burst_{unique}"
    topic = f"cdc.public.{table}"
    total = 20_000
    sql(stack, f"CREATE TABLE {table} (id bigint PRIMARY KEY, body text)")
    connector = connector_factory([f"public.{table}"])
    connector.start()
    connector.wait_running()
    # The kill must land while streaming, after the connector's first commit: killed before any
    # commit, the restart takes the initial snapshot again (Debezium's rule), whose reads carry
    # positions above the streamed ones, and the guard below is not what absorbs them.
    sql(stack, f"INSERT INTO {table} VALUES (0, 'row 0')")
    offsets = connector.home / "cdc" / f"{connector.name}.offsets"
    wait_until(lambda: offsets.is_file() and offsets.stat().st_size > 0, 60, "the first commit")

    def burst() -> None:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            for start in range(1, total + 1, 100):
                conn.execute(
                    f"INSERT INTO {table} SELECT g, 'row ' || g "  # type: ignore[arg-type]
                    f"FROM generate_series({start}, {start + 99}) g"
                )

    writer = threading.Thread(target=burst)
    writer.start()
    wait_until(lambda: topic_length(stack, topic) >= 3000, 120, "the burst to be under way", 0.2)
    connector.kill9()
    delivered_before_kill = topic_length(stack, topic)
    writer.join()
    assert delivered_before_kill < total, "the kill must land mid-burst"

    connector.start()
    wait_until(
        lambda: len({r.key for r in read_topic(stack.kafka, topic)}) >= total + 1,
        240,
        "every row after the restart",
        2,
    )
    changes = changes_on(stack, topic)
    rows, removed = _apply_with_guard(changes)
    assert rows == _table_rows(stack, table)  # 0 lost
    # every duplicate was at or below a delivered position (+1: row 0)
    twice = Counter(int(c.key["id"]) for c in changes)
    seen = [(c.key["id"], c.op, c.position) for c in changes if twice[int(c.key["id"])] > 1]
    assert len(changes) - removed == total + 1, f"not guarded: {sorted(seen)[:6]}"
    print(
        f"\nkill -9 after {delivered_before_kill} of {total} changes: "
        f"{len(changes)} records, {removed} duplicates removed by the position guard"
    )


def test_incremental_snapshot_delivers_every_row_while_streaming(
    stack: Endpoints, unique: str, connector_factory: Factory
) -> None:
    table = f"snap_{unique}"
    topic = f"cdc.public.{table}"
    sql(
        stack,
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, body text)",
        f"INSERT INTO {table} SELECT g, 'old ' || g FROM generate_series(1, 3000) g",
    )
    connector = connector_factory([f"public.{table}"], cdc_snapshot_mode="no_data")
    connector.start()
    connector.wait_running()
    assert topic_length(stack, topic) == 0  # no initial snapshot in this mode

    stop = threading.Event()

    def writes() -> None:
        next_id = 3001
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            while not stop.is_set() and next_id < 4000:
                conn.execute(
                    f"INSERT INTO {table} VALUES (%s, 'new') ",  # type: ignore[arg-type]
                    (next_id,),
                )
                conn.execute(
                    f"UPDATE {table} SET body = 'updated' WHERE id = %s",  # type: ignore[arg-type]
                    (next_id % 3000 + 1,),
                )
                next_id += 1

    writer = threading.Thread(target=writes)
    writer.start()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "infra.cli", "snapshot", f"public.{table}"],
            env=connector.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert "incremental snapshot" in result.stdout

        def snapshot_done() -> bool:
            changes = changes_on(stack, topic)
            return len({int(c.key["id"]) for c in changes if c.op == "r"}) >= 2500

        wait_until(snapshot_done, 240, "the incremental snapshot", 2)
    finally:
        stop.set()
        writer.join()
    expected = _table_rows(stack, table)

    def converged() -> bool:
        changes = changes_on(stack, topic)
        return _apply_with_guard(changes)[0] == expected

    wait_until(converged, 120, "the topic to hold every row of the table", 2)
    changes = changes_on(stack, topic)
    snapshot_keys = {int(c.key["id"]) for c in changes if c.op == "r"}
    streamed_keys = {int(c.key["id"]) for c in changes if c.op in ("c", "u")}
    assert snapshot_keys | streamed_keys >= set(expected)
    assert streamed_keys  # streaming went on during the snapshot
