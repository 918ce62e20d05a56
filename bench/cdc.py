"""CDC throughput: PostgreSQL commit -> Debezium -> broker acknowledgement, against pgbench.

Run: ``.venv/bin/python bench/cdc.py`` (starts its own local stack on free ports, or uses
``TRIBUTARY_POSTGRES_URL`` + ``TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS``). Not a test: it prints.

Figures, each measured in this run:
- live: 50,000 rows inserted in transactions of 100 while the connector runs; events/s from
  the first commit to the broker holding the last change;
- catch-up: the connector started after 50,000 more rows were committed (pure pipeline rate);
- pgbench single-row INSERT tps, 1 and 4 clients, on the same database; the ratios.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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
    settings: Settings, home: Path, name: str, table: str
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "TRIBUTARY_HOME": str(home),
        "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "TRIBUTARY_POSTGRES_URL": settings.database_url,
        "TRIBUTARY_CDC_CONNECTOR_NAME": name,
        "TRIBUTARY_CDC_TABLES": f"public.{table}",
        "TRIBUTARY_CDC_SNAPSHOT_MODE": "no_data",
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


def insert_rows(dsn: str, table: str, first: int) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = time.monotonic()
        for lo in range(first, first + ROWS, TX):
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


def main() -> None:
    local: LocalStack | None = None
    if os.environ.get("TRIBUTARY_POSTGRES_URL") and os.environ.get(
        "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS"
    ):
        settings = Settings()
    else:
        settings = isolated_settings("tributary-bench-cdc-")
        local = LocalStack(settings)
        local.up()
    home = Path(tempfile.mkdtemp(prefix="tributary-bench-cdc-run-"))
    name = f"bench{int(time.time())}"
    table = f"bench_cdc_{name}"
    topic = f"cdc.public.{table}"
    dsn = settings.database_url.replace("postgresql+psycopg://", "postgresql://")
    admin = TopicAdmin(settings.kafka("bench"))
    proc = None
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, body text)")  # type: ignore[arg-type]
        proc = start_connector(settings, home, name, table)
        wait_running(home, name)

        started = insert_rows(dsn, table, 1)
        committed = time.monotonic()
        done_live = wait_for(admin, topic, ROWS)
        live = ROWS / (done_live - started)
        insert_rate = ROWS / (committed - started)

        status = json.loads((home / "cdc" / f"{name}.status.json").read_text())
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        insert_rows(dsn, table, ROWS + 1)
        restart = time.monotonic()
        proc = start_connector(settings, home, name, table)
        done = wait_for(admin, topic, 2 * ROWS)
        catch_up = ROWS / (done - restart)

        tps1 = pgbench(settings, 1)
        tps4 = pgbench(settings, 4)
        print(f"rows per run: {ROWS} in transactions of {TX}")
        print(f"inserting alone (1 client, tx of {TX}):     {insert_rate:10,.0f} rows/s")
        print(f"CDC live, commit -> broker ack:            {live:10,.0f} events/s")
        print(f"CDC catch-up incl. JVM start (~3-5 s):      {catch_up:10,.0f} events/s")
        print(f"pgbench single-row INSERT, 1 client:        {tps1:10,.0f} tps")
        print(f"pgbench single-row INSERT, 4 clients:       {tps4:10,.0f} tps")
        print(f"ratio live / pgbench 1 client:              {live / tps1:10.2f}x")
        print(f"ratio live / pgbench 4 clients:             {live / tps4:10.2f}x")
        print(f"ratio catch-up / pgbench 4 clients:         {catch_up / tps4:10.2f}x")
        wall = done_live - started
        print(
            f"live run, where the time goes: handler reading+routing "
            f"{status['read_seconds']:.2f}s, "
            f"producing until acked {status['publish_seconds']:.2f}s, "
            f"of {wall:.2f}s wall (the rest: Debezium decoding WAL and JSON-converting in the JVM)"
        )
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
        drop_slot(settings.postgres(), f"tributary_{name}")
        drop_publication(settings.postgres(), f"tributary_{name}")
        shutil.rmtree(home, ignore_errors=True)
        if local is not None:
            local.down(purge=True)
            shutil.rmtree(local.settings.home.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
