"""The local stack's own lifecycle, on a stack of its own in a fresh, empty folder."""

import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

from infra.errors import PortInUseError
from infra.stack import LocalStack
from infra.stack.isolated import isolated_settings, settings_env
from infra.stack.process import children, is_alive


@pytest.fixture(scope="module")
def own_stack() -> Iterator[LocalStack]:
    settings = isolated_settings("tributary-lifecycle-")
    stack = LocalStack(settings)
    try:
        yield stack
    finally:
        stack.down()
        shutil.rmtree(settings.home.parent, ignore_errors=True)


def _cli(stack: LocalStack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infra.cli", *args],
        env=settings_env(stack.settings),
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_up_from_empty_folder_then_status_json(own_stack: LocalStack) -> None:
    assert not own_stack.home.exists()
    result = _cli(own_stack, "up")
    assert result.returncode == 0, result.stderr
    status = json.loads(_cli(own_stack, "status", "--json").stdout)
    names = [c["name"] for c in status]
    assert names[:4] == ["postgres", "redis", "objectstore", "broker"]
    assert "cdc" in names  # the connector's row (not started yet)
    for component in status:
        assert {"name", "state", "endpoint", "pid"} <= set(component)
    for component in status[:4]:
        assert set(component) == {"name", "state", "endpoint", "pid", "mode"}
        assert component["state"] == "up"
        assert component["mode"] == "processes"  # not `up --containers`
        assert isinstance(component["pid"], int) and is_alive(component["pid"])
    assert status[0]["endpoint"].endswith(f":{own_stack.settings.postgres_port}/tributary")


def test_up_twice_is_harmless(own_stack: LocalStack) -> None:
    before = {s.name: s.pid for s in own_stack.status()}
    again = own_stack.up()
    assert {s.name: s.pid for s in again} == before
    assert all(s.state == "up" for s in again)


def test_a_taken_port_is_a_clear_error_and_starts_nothing(own_stack: LocalStack) -> None:
    other = LocalStack(isolated_settings("tributary-busy-"))
    try:
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", other.settings.broker_port))
            squatter.listen()
            with pytest.raises(PortInUseError) as err:
                other.up()
            message = str(err.value)
            assert str(other.settings.broker_port) in message
            assert "TRIBUTARY_BROKER_PORT" in message
            assert "nothing was started" in message
            assert all(s.state == "down" and s.pid is None for s in other.status())
            assert not (other.home / "run").exists()
            cli = _cli(other, "up")
            assert cli.returncode == 1
            assert "TRIBUTARY_BROKER_PORT" in cli.stderr
    finally:
        other.down(purge=True)
        shutil.rmtree(other.settings.home.parent, ignore_errors=True)


def test_down_leaves_no_process_alive_and_keeps_data(own_stack: LocalStack) -> None:
    dsn = f"host=127.0.0.1 port={own_stack.settings.postgres_port} user=postgres dbname=tributary"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS kept (id int primary key)")
        conn.execute("INSERT INTO kept VALUES (1) ON CONFLICT DO NOTHING")
    pids = [s.pid for s in own_stack.status() if s.pid is not None]
    family = pids + [child for pid in pids for child in children(pid)]
    assert len(family) > len(pids)  # PostgreSQL's own workers are counted too

    result = _cli(own_stack, "down")
    assert result.returncode == 0, result.stderr
    assert [pid for pid in family if is_alive(pid)] == []
    assert all(s.state == "down" for s in own_stack.status())

    own_stack.up(["postgres"])
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT id FROM kept").fetchall() == [(1,)]
    own_stack.down(purge=True)
    assert not own_stack.home.exists()
