"""The containers mode (``TRIBUTARY_TEST_STACK=containers``): the CDC part as a container
("Debezium via container") killed through the engine's API mid-workload loses nothing that
PostgreSQL acknowledged; and a run leaves no container, pod or network behind, even when a test
fails or the run is interrupted or killed. Skipped in processes mode."""

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.cdc.conftest import changes_on, sql, topic_length
from tests.integration.conftest import Endpoints
from tests.integration.kafka_reading import wait_until
from tributary.changes import ChangeEvent

pytestmark = pytest.mark.containers

PROBE = Path(__file__).with_name("probe_session.py")
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def containers(stack: Endpoints) -> Iterator[Endpoints]:
    if stack.containers is None:
        pytest.skip("runs with TRIBUTARY_TEST_STACK=containers")
    yield stack


def test_killed_cdc_container_loses_nothing_acknowledged(
    containers: Endpoints, unique: str, tmp_path: Path
) -> None:
    from cdc.slots import drop_publication, drop_slot
    from connectors.postgres import PostgresConfig

    stack = containers
    assert stack.containers is not None
    table = f"ctr_{unique}"
    topic = f"cdc.public.{table}"
    name = f"c{unique}"
    sql(stack, f"CREATE TABLE {table} (id bigint PRIMARY KEY, body text)")
    home = tmp_path / "cdc-home"
    cdc = stack.containers.start_cdc(
        name,
        {"TRIBUTARY_CDC_TABLES": f"public.{table}", "TRIBUTARY_CDC_HEARTBEAT_MS": "1000"},
        home,
    )
    engine_container = cdc.get_wrapped_container()
    try:
        # As the process test: the kill lands while streaming, after the connector's first commit.
        sql(stack, f"INSERT INTO {table} VALUES (0, 'row 0')")
        offsets = home / "cdc" / f"{name}.offsets"
        wait_until(lambda: offsets.is_file() and offsets.stat().st_size > 0, 120, "first commit")

        acknowledged: list[int] = [0]  # ids whose INSERT's commit returned

        def workload() -> None:
            with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
                for start in range(1, 20_001, 100):
                    conn.execute(
                        f"INSERT INTO {table} SELECT g, 'row ' || g "  # type: ignore[arg-type]
                        f"FROM generate_series({start}, {start + 99}) g"
                    )
                    acknowledged.extend(range(start, start + 100))

        writer = threading.Thread(target=workload)
        writer.start()
        wait_until(lambda: topic_length(stack, topic) >= 3000, 120, "the workload under way", 0.2)
        engine_container.kill()  # SIGKILL, through the engine's API
        wait_until(lambda: _status(engine_container) == "exited", 30, "the container to exit")
        assert engine_container.attrs["State"]["ExitCode"] == 137  # 128 + SIGKILL
        delivered_before_kill = topic_length(stack, topic)
        writer.join()
        assert delivered_before_kill < len(acknowledged), "the kill must land mid-workload"

        engine_container.start()  # the same container: its state folder, its offsets
        expected = set(acknowledged)

        def keys() -> set[int]:
            changes: list[ChangeEvent] = changes_on(stack, topic)
            return {int(c.key["id"]) for c in changes if not c.is_delete}

        wait_until(lambda: expected <= keys(), 180, "every acknowledged change after restart", 1)
        lost = expected - keys()
        assert lost == set(), f"{len(lost)} acknowledged changes lost"
        with psycopg.connect(stack.postgres_dsn) as conn:
            count = conn.execute(f"SELECT count(*) FROM {table}").fetchone()  # type: ignore[arg-type]
        assert count == (len(expected),)
    finally:
        stack.containers.remove(name)
        db = PostgresConfig(stack.database_url)
        drop_slot(db, f"tributary_{name}")
        drop_publication(db, f"tributary_{name}")


def _status(container: Any) -> str:
    container.reload()
    return str(container.status)


# -- nothing left behind -------------------------------------------------------------------


def _engine_objects(kind: str) -> set[str]:
    """Ids of the engine's pods or networks now (podman has pods; Docker none)."""
    from infra.containers.engine import detect_engine

    engine = detect_engine()
    if kind == "pods":
        if not engine.is_podman:
            return set()
        listed = engine.output(["pod", "ps", "--format", "json"]) or "[]"
        return {p["Id"] for p in json.loads(listed)}
    return set(engine.output(["network", "ls", "--format", "{{.ID}}"]).split())


def _run_containers(owner_pid: int) -> list[str]:
    from infra.containers.stack import OWNER_LABEL, docker_client, owner_id

    host = owner_id().rpartition(":")[0]
    found = docker_client().containers.list(
        all=True, filters={"label": [f"{OWNER_LABEL}={host}:{owner_pid}"]}
    )
    return [c.id for c in found]


def _probe(mode: str, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    marker = tmp_path / f"{mode}.up"
    env = {
        **os.environ,
        "TRIBUTARY_TEST_STACK": "containers",
        "TRIBUTARY_TEST_PROBE_MODE": mode,
        "TRIBUTARY_TEST_PROBE_MARKER": str(marker),
        "PYTHONPATH": str(REPO),
    }
    argv = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q"]
    proc = subprocess.Popen(
        [*argv, str(PROBE)],
        env=env,
        cwd=REPO,
        stdout=open(tmp_path / f"{mode}.out", "wb"),  # noqa: SIM115 - closed with the process
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, marker


@pytest.mark.parametrize("mode", ["fail", "sigint", "sigterm", "kill9"])
def test_a_run_leaves_no_container_pod_or_network(
    containers: Endpoints, mode: str, tmp_path: Path
) -> None:
    """A session of its own (a probe test file run by pytest in a subprocess) whose test fails,
    or that is interrupted (SIGINT, SIGTERM) or killed (SIGKILL) once its stack is up: after
    it, no container of that run, and no pod or network it made, is left. After SIGKILL no
    clean-up can run in the process: the next session's start removes the orphans."""
    from infra.containers.stack import reap_orphans

    pods, networks = _engine_objects("pods"), _engine_objects("networks")
    proc, marker = _probe(mode, tmp_path)
    try:
        wait_until(marker.exists, 180, f"the probe session ({mode}) to start its stack", 0.2)
        assert _run_containers(proc.pid), "the probe's stack runs while its test runs"
        Path(f"{marker}.go").touch()  # the probe fails, interrupts itself or waits
        signals = {"sigterm": signal.SIGTERM, "kill9": signal.SIGKILL}
        if mode in signals:
            os.kill(proc.pid, signals[mode])
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = (tmp_path / f"{mode}.out").read_text(errors="replace")[-3000:]
    expected_code = {"fail": 1, "sigint": 2, "sigterm": 2, "kill9": -9}[mode]
    assert code == expected_code, output
    if mode == "kill9":
        assert _run_containers(proc.pid), "nothing could clean up after SIGKILL"
        reap_orphans()  # what the next session's start does
    assert _run_containers(proc.pid) == [], output
    assert _engine_objects("pods") - pods == set()
    assert _engine_objects("networks") - networks == set()
