"""CDC throughput: PostgreSQL commit -> Debezium -> broker acknowledgement, against pgbench.

Run: ``.venv/bin/python bench/cdc.py`` (starts its own local stack on free ports, or uses
``TRIBUTARY_POSTGRES_URL`` + ``TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS``). Not a test: it prints.

Figures, each measured in this run, for each publisher of the CDC part (``--publishers``:
``python`` = every change through Python's producer, ``jvm`` = Kafka's Java producer in the
engine's JVM):
- inserting alone: the rows inserted in transactions of 100 with no connector running (the
  baseline of every ratio);
- live: the same rows inserted while the connector runs (its JVM just started); events/s from
  the first commit to the broker holding the last change;
- live again: as many more rows, the JVM now warm (its JIT done with the hot paths);
- catch-up: the connector started after as many more rows were committed (pure pipeline rate);
- pgbench single-row INSERT tps, 1 and 4 clients, on the same database (for reference).
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stopping import stop_cleanly_on_sigterm
from cdc.slots import drop_publication, drop_slot
from connectors.kafka import TopicAdmin
from infra.settings import Settings
from infra.stack import LocalStack
from infra.stack.isolated import isolated_settings

ROWS = 50_000
TX = 100
PGBENCH = "/usr/lib/postgresql/15/bin/pgbench"


def end_offset(admin: TopicAdmin, topic: str) -> int:
    if topic not in admin.topic_names():
        return 0
    return sum(admin.end_offsets(topic).values())


def wait_for(admin: TopicAdmin, topic: str, n: int, timeout: float = 600) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if end_offset(admin, topic) >= n:
            return time.monotonic()
        time.sleep(0.05)
    raise SystemExit(f"timed out: {topic} has {end_offset(admin, topic)} of {n}")


def start_connector(
    settings: Settings, home: Path, name: str, table: str, publisher: str
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "TRIBUTARY_HOME": str(home),
        "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "TRIBUTARY_POSTGRES_URL": settings.database_url,
        "TRIBUTARY_CDC_CONNECTOR_NAME": name,
        "TRIBUTARY_CDC_TABLES": f"public.{table}",
        "TRIBUTARY_CDC_SNAPSHOT_MODE": "no_data",
        "TRIBUTARY_CDC_PUBLISHER": publisher,
    }
    log = open(home / "connector.out", "ab")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "run", "cdc"], env=env, stdout=log, stderr=log
    )


def wait_running(home: Path, name: str) -> None:
    status = home / "cdc" / f"{name}.status.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if status.exists() and '"state": "running"' in status.read_text():
            return
        time.sleep(0.2)
    raise SystemExit("connector did not start; see " + str(home / "connector.out"))


def insert_rows(dsn: str, table: str, first: int, rows: int) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = time.monotonic()
        for lo in range(first, first + rows, TX):
            conn.execute(
                f"INSERT INTO {table} SELECT g, md5(g::text) "  # type: ignore[arg-type]
                f"FROM generate_series({lo}, {lo + TX - 1}) g"
            )
        return start


def pgbench(settings: Settings, clients: int, seconds: int = 10) -> float:
    dsn = settings.database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_pgbench")
        conn.execute("CREATE TABLE bench_pgbench (id bigserial PRIMARY KEY, v double precision)")
    script = Path(tempfile.mkdtemp()) / "insert.sql"
    script.write_text("INSERT INTO bench_pgbench (v) VALUES (random());\n")
    os.chmod(script.parent, 0o755)
    out = subprocess.run(
        [
            PGBENCH,
            "-n",
            "-f",
            str(script),
            "-c",
            str(clients),
            "-j",
            str(min(clients, 2)),
            "-T",
            str(seconds),
            dsn,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    match = re.search(r"tps = ([0-9.]+)", out)
    assert match, out
    return float(match.group(1))


@dataclass
class Run:
    publisher: str
    live: float
    warm: float
    catch_up: float
    read_s: float
    publish_s: float
    wall_s: float


def measure(settings: Settings, publisher: str, rows: int) -> Run:
    """Live and catch-up rates of one connector publishing through ``publisher``."""
    home = Path(tempfile.mkdtemp(prefix="tributary-bench-cdc-run-"))
    name = f"bench{publisher}{int(time.time())}"
    table = f"bench_cdc_{name}"
    topic = f"cdc.public.{table}"
    dsn = settings.database_url.replace("postgresql+psycopg://", "postgresql://")
    admin = TopicAdmin(settings.kafka("bench"))
    proc = None
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, body text)")  # type: ignore[arg-type]
        proc = start_connector(settings, home, name, table, publisher)
        wait_running(home, name)
        started = insert_rows(dsn, table, 1, rows)
        done_live = wait_for(admin, topic, rows)
        before = json.loads((home / "cdc" / f"{name}.status.json").read_text())
        warm_started = insert_rows(dsn, table, rows + 1, rows)
        done_warm = wait_for(admin, topic, 2 * rows)
        status = json.loads((home / "cdc" / f"{name}.status.json").read_text())
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        insert_rows(dsn, table, 2 * rows + 1, rows)
        restart = time.monotonic()
        proc = start_connector(settings, home, name, table, publisher)
        done = wait_for(admin, topic, 3 * rows)
        return Run(
            publisher,
            live=rows / (done_live - started),
            warm=rows / (done_warm - warm_started),
            catch_up=rows / (done - restart),
            read_s=status["read_seconds"] - before["read_seconds"],
            publish_s=status["publish_seconds"] - before["publish_seconds"],
            wall_s=done_warm - warm_started,
        )
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
        drop_slot(settings.postgres(), f"tributary_{name}")
        drop_publication(settings.postgres(), f"tributary_{name}")
        shutil.rmtree(home, ignore_errors=True)


def insert_alone(settings: Settings, rows: int) -> float:
    """Rows/s of the same inserts with no connector running."""
    dsn = settings.database_url.replace("postgresql+psycopg://", "postgresql://")
    table = f"bench_alone_{int(time.time())}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, body text)")  # type: ignore[arg-type]
    started = insert_rows(dsn, table, 1, rows)
    return rows / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=ROWS, help="rows per run (default %(default)s)")
    parser.add_argument(
        "--publishers",
        default="python,jvm",
        help="the CDC part's publishers to measure, in this order (TRIBUTARY_CDC_PUBLISHER)",
    )
    args = parser.parse_args()
    local: LocalStack | None = None
    if os.environ.get("TRIBUTARY_POSTGRES_URL") and os.environ.get(
        "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS"
    ):
        settings = Settings()
    else:
        settings = isolated_settings("tributary-bench-cdc-")
        local = LocalStack(settings)
        local.up()
    try:
        alone = insert_alone(settings, args.rows)
        runs = [measure(settings, p, args.rows) for p in args.publishers.split(",")]
        tps1 = pgbench(settings, 1)
        tps4 = pgbench(settings, 4)
        print(f"rows per run: {args.rows} in transactions of {TX}")
        print(f"inserting alone (no connector, 1 client):   {alone:10,.0f} rows/s")
        print(f"pgbench single-row INSERT, 1 / 4 clients:   {tps1:10,.0f} / {tps4:,.0f} tps")
        for run in runs:
            print(
                f"[{run.publisher:>6}] live, commit -> broker ack: {run.live:10,.0f} events/s"
                f" = {run.live / alone:.2f}x inserting alone"
            )
            print(
                f"[{run.publisher:>6}] live again (JVM warm):       {run.warm:10,.0f} events/s"
                f" = {run.warm / alone:.2f}x inserting alone"
            )
            print(
                f"[{run.publisher:>6}] catch-up incl. JVM start:   {run.catch_up:10,.0f} events/s"
                f" = {run.catch_up / alone:.2f}x inserting alone"
            )
            print(
                f"[{run.publisher:>6}] warm run, where the time goes: handler reading+routing"
                f" {run.read_s:.2f}s, producing until acked {run.publish_s:.2f}s, of"
                f" {run.wall_s:.2f}s wall (the rest: Debezium decoding WAL and JSON-converting)"
            )
    finally:
        if local is not None:
            local.down(purge=True)
            shutil.rmtree(local.settings.home.parent, ignore_errors=True)


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
