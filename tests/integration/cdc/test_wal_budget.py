"""The WAL budget: a stopped connector's slot holds back WAL; `cdc-status` warns before the
budget (max_slot_wal_keep_size) is reached; past it PostgreSQL invalidates the slot, and the
connector recovers at its next start with a fresh snapshot instead of failing forever."""

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from cdc.slots import slot_info
from connectors.postgres import PostgresConfig
from tests.integration.cdc.conftest import changes_on
from tests.integration.cdc_process import CdcProcess
from tests.integration.conftest import Endpoints
from tests.integration.kafka_reading import wait_until

BUDGET_MB = 32


@pytest.fixture
def small_budget(stack: Endpoints) -> Iterator[None]:
    """max_slot_wal_keep_size = 32MB for this test (restored after)."""
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        row = conn.execute("SHOW max_slot_wal_keep_size").fetchone()
        assert row is not None
        conn.execute(f"ALTER SYSTEM SET max_slot_wal_keep_size = '{BUDGET_MB}MB'")
        conn.execute("SELECT pg_reload_conf()")
    yield
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET max_slot_wal_keep_size = '{row[0]}'")  # type: ignore[arg-type]
        conn.execute("SELECT pg_reload_conf()")


def cdc_status(cdc: CdcProcess) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "infra.cli", "cdc-status", "--json"],
        env=cdc.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    info: dict[str, Any] = json.loads(done.stdout)
    return info


def write_wal(dsn: str, table: str, megabytes: int) -> None:
    """About ``megabytes`` of WAL, written by a table nobody captures."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (v text)")  # type: ignore[arg-type]
        conn.execute(
            f"INSERT INTO {table} SELECT repeat(md5(i::text), 30)"  # type: ignore[arg-type]
            f" FROM generate_series(1, {megabytes * 1000}) i"
        )


def test_a_slot_past_its_wal_budget_warns_then_recovers_by_a_snapshot(
    stack: Endpoints, connector_factory: Any, unique: str, small_budget: None
) -> None:
    table, junk = f"public.wal_{unique}", f"public.junk_{unique}"
    topic = f"cdc.{table}"
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")  # type: ignore[arg-type]
        conn.execute(f"INSERT INTO {table} SELECT i, 'before' FROM generate_series(1, 20) i")  # type: ignore[arg-type]
    cdc: CdcProcess = connector_factory([table])
    try:
        cdc.start()
        cdc.wait_running()
        wait_until(lambda: len(changes_on(stack, topic)) >= 20, 60, "the snapshot")
        assert cdc.terminate() == 0, cdc.output()
        db = PostgresConfig(stack.database_url)
        slot = f"tributary_{cdc.name}"

        # Stopped: the slot holds WAL back. Past 80% of the budget, status warns.
        write_wal(stack.postgres_dsn, junk, 28)
        info = slot_info(db, slot)
        assert info is not None and info.budget_bytes == BUDGET_MB * 2**20
        assert (info.budget_used() or 0) >= 0.8, info
        status = cdc_status(cdc)
        assert status["wal_budget_bytes"] == BUDGET_MB * 2**20
        assert "of its WAL budget" in (status["warning"] or ""), status

        # Changes while it is down, then more WAL than the budget: the slot is invalidated.
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"UPDATE {table} SET v = 'after' WHERE id = 1")  # type: ignore[arg-type]
            conn.execute(f"INSERT INTO {table} VALUES (21, 'new')")  # type: ignore[arg-type]
        write_wal(stack.postgres_dsn, junk, 48)
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_switch_wal()")
            conn.execute("CHECKPOINT")
        info = slot_info(db, slot)
        assert info is not None and info.invalidated, info
        assert "invalidated" in (cdc_status(cdc)["warning"] or "")

        # The next start recovers by a fresh snapshot, saying so, instead of failing forever.
        cdc.start()
        cdc.wait_running()
        wait_until(
            lambda: any(
                c.after is not None and c.after.get("id") == 21 for c in changes_on(stack, topic)
            ),
            120,
            "the fresh snapshot",
        )
        assert "invalidated by max_slot_wal_keep_size" in cdc.output()
        latest: dict[int, Any] = {}
        for change in changes_on(stack, topic):
            if change.after is not None:
                latest[int(change.after["id"])] = change.after["v"]
        assert latest[1] == "after" and latest[21] == "new" and len(latest) == 21
        status = cdc_status(cdc)
        assert "fresh snapshot" in (status["recovered"] or "")
        info = slot_info(db, slot)
        assert info is not None and not info.invalidated
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {junk}")  # type: ignore[arg-type]
            conn.execute(f"DROP TABLE IF EXISTS {table}")  # type: ignore[arg-type]
