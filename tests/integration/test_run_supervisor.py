"""`tributary run cdc commands`: each part in its own process, a dead one restarted, all stopped
cleanly on SIGTERM."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psycopg

from cdc.slots import drop_publication, drop_slot
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
        assert "cdc: stopped" in text and "commands: stopped" in text
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
