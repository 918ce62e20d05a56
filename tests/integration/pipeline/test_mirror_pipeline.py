"""The whole pipeline, real parts only: PostgreSQL -> the Debezium connector -> Kafka -> the
Spark mirror (`tributary run views`), with inserts, updates and deletes on a table of many
types, a column added mid-stream, and the view process killed with kill -9 on the way."""

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from infra.polling import Deadline, poll_until
from tests.integration.cdc_process import CdcProcess
from tests.integration.conftest import Endpoints
from tests.integration.pipeline.views_process import ViewsProcess

COLUMNS = """
    id bigint PRIMARY KEY,
    n integer NOT NULL,
    big bigint,
    amount numeric(12,3),
    at timestamptz,
    doc jsonb,
    flag boolean,
    tags text[],
    day date,
    ts3 timestamp(3),
    ts6 timestamp,
    raw bytea,
    name text,
    version integer NOT NULL
"""


class Workload:
    """Random inserts, updates and deletes on the source table; ``version`` counts a row's
    changes since its insert, so the mirror's applied count must equal it."""

    def __init__(self, dsn: str, table: str, seed: int = 11) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.table = table
        self.rng = random.Random(seed)
        self.next_id = 1
        self.live: list[int] = []
        self.done = 0
        self.widened = False

    def values(self) -> dict[str, Any]:
        r = self.rng
        return {
            "n": r.randrange(-(2**31), 2**31),
            "big": r.choice([None, r.randrange(-(2**62), 2**62)]),
            "amount": r.choice([None, f"{r.randrange(-(10**8), 10**8)}.{r.randrange(1000):03d}"]),
            "at": f"2026-0{r.randrange(1, 10)}-1{r.randrange(10)} 1{r.randrange(10)}:0"
            f"{r.randrange(10)}:1{r.randrange(10)}.{r.randrange(10**6):06d}+0{r.randrange(10)}",
            "doc": r.choice(['{"a": [1, 2, {"b": null}], "c": "x\\"y"}', "[1, 2]", '"text"', None]),
            "flag": r.choice([True, False, None]),
            "tags": r.choice([["a", "b c", 'q"uote'], [], None]),
            "day": f"20{r.randrange(10, 40)}-0{r.randrange(1, 10)}-2{r.randrange(8)}",
            "ts3": f"2025-05-05 05:05:05.{r.randrange(1000):03d}",
            "ts6": f"1999-12-31 23:59:59.{r.randrange(10**6):06d}",
            "raw": r.choice([bytes(r.randrange(256) for _ in range(r.randrange(12))), None]),
            "name": r.choice(["plain", "ünïcode ✓", "", None]),
        }

    def step(self) -> None:
        roll = self.rng.random()
        if not self.live or roll < 0.35:
            row_id, self.next_id = self.next_id, self.next_id + 1
            values = self.values()
            names = ", ".join(values)
            marks = ", ".join(["%s"] * len(values))
            self.conn.execute(
                f"INSERT INTO {self.table} (id, {names}, version) VALUES (%s, {marks}, 1)",
                (row_id, *values.values()),
            )
            self.live.append(row_id)
        elif roll < 0.5:
            row_id = self.live.pop(self.rng.randrange(len(self.live)))
            self.conn.execute(f"DELETE FROM {self.table} WHERE id = %s", (row_id,))
        else:
            values = self.values()
            if self.widened:
                values["note"] = self.rng.choice(["after the ALTER", None])
            sets = ", ".join(f"{k} = %s" for k in values)
            self.conn.execute(
                f"UPDATE {self.table} SET {sets}, version = version + 1 WHERE id = %s",
                (*values.values(), self.rng.choice(self.live)),
            )
        self.done += 1

    def widen(self) -> None:
        self.conn.execute(f"ALTER TABLE {self.table} ADD COLUMN note varchar(40)")
        self.widened = True


def rows(dsn: str, table: str) -> dict[int, dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        cur = conn.execute(f"SELECT * FROM {table}")
        names = [d.name for d in cur.description or ()]
        return {r[0]: dict(zip(names, r, strict=True)) for r in cur.fetchall()}


def column_types(dsn: str, schema: str, table: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
            " WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped",
            (f'"{schema}"."{table}"',),
        ).fetchall()
    return {str(name): str(kind) for name, kind in found}


def strip_meta(found: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    meta = ("_position", "_applied_count")
    return {k: {c: v for c, v in r.items() if c not in meta} for k, r in found.items()}


#: The waits of the kill -9 test draw on one budget, below the test's own timeout, so a wait
#: that runs out fails with its own message.
TEST_TIMEOUT_S = 420
BUDGET_S = TEST_TIMEOUT_S - 30
#: The writer's changes: BEFORE_KILL at full speed (the column is added at WIDEN_AT), then one
#: every TRICKLE_S until the test has killed the view process, then AFTER_KILL at full speed.
BEFORE_KILL, WIDEN_AT, TRICKLE_S, AFTER_KILL = 1800, 1200, 0.1, 600


@pytest.fixture
def source(stack: Endpoints, unique: str) -> Iterator[str]:
    table = f"pipe_{unique}"
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE public.{table} ({COLUMNS})")
    yield table
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS public.{table}")
        conn.execute(f"DROP SCHEMA IF EXISTS views_{table} CASCADE")


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_postgres_to_debezium_to_the_spark_mirror_survives_kill_9(
    stack: Endpoints, connector_factory: Any, source: str, tmp_path: Path
) -> None:
    schema = f"views_{source}"
    connector: CdcProcess = connector_factory([f"public.{source}"])
    connector.start()
    connector.wait_running()
    views = ViewsProcess(
        stack,
        tmp_path / "views",
        mirror_tables=f"public.{source}",
        views_schema=schema,
        view_max_offsets_per_trigger="300",
    )
    views.start()
    workload = Workload(stack.postgres_dsn, f"public.{source}")
    errors: list[BaseException] = []
    going = threading.Event()  # set by the writer: BEFORE_KILL changes are in
    killed = threading.Event()  # set by the test once the kill -9 is done (or the test ends)
    ending = threading.Event()  # set when the test ends early: the writer stops at once

    def burst(start: int, count: int) -> None:
        for i in range(start, start + count):
            if ending.is_set():
                return
            if i == WIDEN_AT:
                workload.widen()
            workload.step()
            if i % 50 == 0:
                time.sleep(0.05)

    def write() -> None:
        try:
            burst(0, BEFORE_KILL)
            going.set()
            # Still writing, however long Spark takes to start: the writer cannot finish
            # before the test has killed the view process, so the kill falls amid changes.
            while not killed.wait(TRICKLE_S):
                workload.step()
            burst(BEFORE_KILL, AFTER_KILL)
        except BaseException as exc:  # surfaced by the assertions below
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        mirror = f"{schema}.public_{source}"
        budget = Deadline(BUDGET_S)
        assert going.wait(budget.left(120)), f"the workload did not get going: {errors}"

        def mirrored_some() -> bool:
            assert views.alive(), views.output()
            assert not errors, errors
            return len(rows(stack.postgres_dsn, mirror)) > 10

        poll_until(
            mirrored_some,
            budget.left(180),
            "the first rows in the mirror",
            retry_on=(psycopg.errors.UndefinedTable,),  # until the first batch creates it
        )
        assert writer.is_alive(), f"the writer stopped before the kill: {errors}"
        at_kill = workload.done
        views.kill9()  # mid-workload, most likely inside a batch
        # kill9 returns once the process is gone and the writer cannot end before `killed`:
        # alive now, it was writing throughout the kill (and a change lands after it).
        assert writer.is_alive(), f"the writer stopped during the kill: {errors}"

        def wrote_since_the_kill() -> bool:
            assert not errors, errors
            return workload.done > at_kill

        poll_until(wrote_since_the_kill, budget.left(30), "a change after the kill", every=0.05)
        killed.set()
        views.start()
        writer.join(budget.left(240))
        least = at_kill + AFTER_KILL
        assert not writer.is_alive(), f"the workload did not finish ({workload.done} of {least}+)"
        assert not errors, errors
        assert workload.done > least  # all of the burst after the kill, and the trickle's
        source_rows = rows(stack.postgres_dsn, f"public.{source}")

        def converged() -> bool:
            assert views.alive(), views.output()  # ends the wait at once
            return strip_meta(rows(stack.postgres_dsn, mirror)) == source_rows

        poll_until(converged, budget.left(240), "the mirror to equal the source table")
        mirrored = rows(stack.postgres_dsn, mirror)
        assert len(mirrored) > 100
        # Same types as the source, column added mid-stream included; applied counts exact.
        source_types = column_types(stack.postgres_dsn, "public", source)
        assert "note" in source_types
        assert column_types(stack.postgres_dsn, schema, f"public_{source}") == {
            **source_types,
            "_position": "bigint",
            "_applied_count": "bigint",
        }
        assert {k: r["_applied_count"] for k, r in mirrored.items()} == {
            k: r["version"] for k, r in source_rows.items()
        }
        assert any(r["note"] == "after the ALTER" for r in mirrored.values())
    finally:
        ending.set()
        killed.set()
        writer.join(30)
        views.stop()
        connector.stop()
