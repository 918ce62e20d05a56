"""`tributary run cdc commands`: each part in its own process, a dead one restarted, all stopped
cleanly on SIGTERM."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from cdc.slots import drop_publication, drop_slot
from connectors.leases import Lease, LeaseHeldError
from connectors.postgres import PostgresConfig
from infra.stack.process import is_alive
from tests.integration.conftest import Endpoints
from tests.integration.kafka_reading import wait_until


def _children(log: Path) -> dict[str, int]:
    """The latest PID the supervisor announced for each component."""
    pids: dict[str, int] = {}
    for name, pid in re.findall(r"run: (\w+): started \(pid (\d+)\)", log.read_text()):
        pids[name] = int(pid)
    return pids


def test_run_supervises_restarts_and_stops(stack: Endpoints, unique: str, tmp_path: Path) -> None:
    name = f"sup{unique}"
    env = {
        **os.environ,
        "TRIBUTARY_HOME": str(tmp_path),
        "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        **stack.settings.kafka_security_env(),  # SASL/TLS of a brought Kafka
        "TRIBUTARY_SCHEMA_REGISTRY_URL": stack.settings.registry_url,
        "TRIBUTARY_POSTGRES_URL": stack.database_url,
        "TRIBUTARY_REDIS_URL": stack.redis_url,
        "TRIBUTARY_CDC_CONNECTOR_NAME": name,
        "TRIBUTARY_CDC_TABLES": f"es_{unique}.events",
        "TRIBUTARY_CDC_OUTBOX_TABLE": f"es_{unique}.events",
        "TRIBUTARY_EVENT_STORE_SCHEMA": f"es_{unique}",
        "TRIBUTARY_COMMANDS_TOPIC": f"commands-{unique}",
        "TRIBUTARY_COMMAND_RESULTS_TOPIC": f"command-results-{unique}",
        "TRIBUTARY_COMMAND_PROCESSOR_NAME": f"proc-{unique}",
        "COLUMNS": "200",
    }
    log = tmp_path / "supervisor.out"
    with open(log, "wb") as out:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "infra.cli", "run", "cdc", "commands"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: set(_children(log)) == {"cdc", "commands"}, 60, "both components")
        first = _children(log)
        wait_until(
            lambda: '"state": "running"' in _read(tmp_path / "cdc" / f"{name}.status.json"),
            120,
            "the connector to run",
        )
        os.kill(first["cdc"], signal.SIGKILL)
        wait_until(lambda: _children(log).get("cdc") != first["cdc"], 30, "the restart")
        text = log.read_text()
        assert "cdc: exited with code -9; restart #1" in text
        restarted = _children(log)
        assert is_alive(restarted["cdc"]) and restarted["commands"] == first["commands"]

        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(120) == 0
        assert not is_alive(restarted["cdc"]) and not is_alive(restarted["commands"])
        text = log.read_text()
        # each part's own time from SIGTERM to its exit
        assert re.search(r"cdc: stopped in \d+\.\ds", text), text[-2000:]
        assert re.search(r"commands: stopped in \d+\.\ds", text), text[-2000:]
        assert "killed after" not in text  # both finished their work and exited on SIGTERM
        assert "all components stopped" in text
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
        for pid in _children(log).values():
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)
        db = PostgresConfig(stack.database_url)
        drop_slot(db, f"tributary_{name}")
        drop_publication(db, f"tributary_{name}")
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS es_{unique} CASCADE")  # type: ignore[arg-type]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_kill_9_of_run_takes_its_children_and_no_part_runs_twice(
    stack: Endpoints, unique: str, tmp_path: Path
) -> None:
    """kill -9 of `tributary run`: its children end with it; a new `run` starts one copy of
    each part; a second copy of a part refuses to start and names the holder."""
    table = f"sup_{unique}"
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE public.{table} (id int PRIMARY KEY, v text)")  # type: ignore[arg-type]
        conn.execute(f"INSERT INTO public.{table} VALUES (1, 'a')")  # type: ignore[arg-type]
    name = f"sup{unique}"
    env = {
        **os.environ,
        "TRIBUTARY_HOME": str(tmp_path),
        "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        **stack.settings.kafka_security_env(),  # SASL/TLS of a brought Kafka
        "TRIBUTARY_SCHEMA_REGISTRY_URL": stack.settings.registry_url,
        "TRIBUTARY_POSTGRES_URL": stack.database_url,
        "TRIBUTARY_REDIS_URL": stack.redis_url,
        "TRIBUTARY_CDC_CONNECTOR_NAME": name,
        "TRIBUTARY_CDC_TABLES": f"public.{table}",
        "TRIBUTARY_CDC_OUTBOX_TABLE": "",
        "TRIBUTARY_CDC_TOPIC_PREFIX": f"cdc{unique}",
        "TRIBUTARY_MIRROR_TABLES": f"public.{table}",
        "TRIBUTARY_VIEWS": "",
        "TRIBUTARY_VIEWS_SCHEMA": f"views_{unique}",
        "TRIBUTARY_VERIFY_INTERVAL_S": "0",
        "COLUMNS": "200",
    }

    def start(log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "infra.cli", "run", "cdc", "views"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    first_log, second_log = tmp_path / "first.out", tmp_path / "second.out"
    first = start(first_log)
    survivors: list[int] = []
    second = None
    try:
        wait_until(lambda: set(_children(first_log)) == {"cdc", "views"}, 60, "the parts")
        children = _children(first_log)
        views_log = tmp_path / "logs" / "run-views.log"
        wait_until(lambda: "running generation" in _read(views_log), 180, "the view to run")
        os.kill(first.pid, signal.SIGKILL)  # the supervisor itself
        first.wait(30)
        wait_until(
            lambda: not any(is_alive(pid) for pid in children.values()), 90, "the children to end"
        )

        second = start(second_log)
        wait_until(lambda: set(_children(second_log)) == {"cdc", "views"}, 60, "the parts again")
        wait_until(lambda: _read(views_log).count("running generation") >= 2, 180, "the view again")
        restarted = _children(second_log)
        assert all(is_alive(pid) for pid in restarted.values())
        assert not set(restarted.values()) & set(children.values())

        # A second copy of a part, started by hand, refuses and says who runs it.
        duplicate = subprocess.run(
            [sys.executable, "-m", "infra.cli", "run", "cdc"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert duplicate.returncode == 1
        assert (
            f"cdc:{name} is already running: pid {restarted['cdc']}"
            in duplicate.stdout + duplicate.stderr
        )
        # The running view holds its lease: any second runner of that view is refused.
        with pytest.raises(LeaseHeldError, match=f"pid {restarted['views']}"):
            Lease(stack.postgres_dsn, f"view:mirror.public.{table}").acquire()
        assert _read(views_log).count(f"view mirror.public.{table}: running generation") == 2
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(120)
        for log in (first_log, second_log):
            survivors += [pid for pid in _children(log).values() if is_alive(pid)]
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
        db = PostgresConfig(stack.database_url)
        drop_slot(db, f"tributary_{name}")
        drop_publication(db, f"tributary_{name}")
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS public.{table}")  # type: ignore[arg-type]
            conn.execute(f"DROP SCHEMA IF EXISTS views_{unique} CASCADE")  # type: ignore[arg-type]
    assert survivors == []
