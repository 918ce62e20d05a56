"""``tributary serve`` as a real server in a child process: it answers the view queries, runs
commands through a bus built from the settings (creating the event store's schema), stops with
exit 0 on SIGTERM, and refuses a busy port plainly."""

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from connectors.postgres import PostgresConfig, make_engine
from event_store import drop_schema
from examples.social import create_users_table, upsert_user
from infra.errors import WaitTimeoutError
from infra.polling import poll_until
from infra.stack.isolated import free_port_block
from projections.view import View
from tests.integration.api.library import USERS_SCHEMA_ENV
from tests.integration.api.test_cli_query import ROOT, query_env
from tests.integration.conftest import Endpoints


@pytest.fixture
def serve_env(
    stack: Endpoints, api_views: list[View], views_schema: str, unique: str, tmp_path: Path
) -> Iterator[dict[str, str]]:
    users, events = f"apiusers_{unique}", f"es_api_{unique}"
    engine = make_engine(PostgresConfig(stack.database_url, pool_size=1))
    with engine.begin() as conn:
        upsert_user(conn, create_users_table(conn, users), 1, "ann")
    try:
        yield query_env(
            stack,
            views_schema,
            tmp_path,
            TRIBUTARY_COMMAND_HANDLERS="tests.integration.api.library:command_registry",
            TRIBUTARY_EVENT_STORE_SCHEMA=events,
            **{USERS_SCHEMA_ENV: users},
        )
    finally:
        with engine.begin() as conn:
            drop_schema(conn, events)
            drop_schema(conn, users)
        engine.dispose()


def serve(env: dict[str, str], port: int, out: Path) -> subprocess.Popen[bytes]:
    with open(out, "wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "infra.cli", "serve", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


def wait_until_up(base: str, server: subprocess.Popen[bytes], log: Path) -> None:
    def answers() -> bool:
        assert server.poll() is None, log.read_text()
        httpx.get(f"{base}/openapi.json", timeout=2)
        return True

    try:
        poll_until(answers, 60, "serve to answer", 0.2, retry_on=(httpx.TransportError,))
    except WaitTimeoutError as exc:
        raise AssertionError(f"{exc}: {log.read_text()}") from exc


def test_serve_answers_runs_commands_and_stops_on_sigterm(
    stack: Endpoints, serve_env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port_block(1)
    base, log = f"http://127.0.0.1:{port}", tmp_path / "serve.log"
    server = serve(serve_env, port, log)
    try:
        wait_until_up(base, server, log)
        health = httpx.get(f"{base}/health", timeout=30)
        assert health.status_code == 200 and health.json()["status"] == "ok", health.text
        assert httpx.get(f"{base}/notes/2").json()["text"] == "second"
        assert httpx.get(f"{base}/notes/99").status_code == 404

        command = {"type": "CreatePost", "data": {"post_id": 5, "author_id": 1, "text": "served"}}
        result = httpx.post(f"{base}/commands", json=command, timeout=30)
        assert result.status_code == 200 and result.json()["status"] == "accepted", result.text
        rejected = {"type": "CreatePost", "data": {"post_id": 6, "author_id": 2, "text": "no"}}
        assert httpx.post(f"{base}/commands", json=rejected).json()["status"] == "rejected"
        engine = make_engine(PostgresConfig(stack.database_url, pool_size=1))
        with engine.connect() as conn:
            schema = serve_env["TRIBUTARY_EVENT_STORE_SCHEMA"]
            count = conn.execute(text(f"SELECT count(*) FROM {schema}.events")).scalar_one()
        engine.dispose()
        assert count == 1

        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0, log.read_text()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
    output = log.read_text()
    assert f"serving http://127.0.0.1:{port}" in output and "stopped" in output
    assert "Traceback" not in output


def test_a_busy_port_is_refused_naming_the_port_and_the_option(
    serve_env: dict[str, str], tmp_path: Path
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        log = tmp_path / "busy.log"
        server = serve(serve_env, port, log)
        try:
            code = server.wait(60)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait(10)
    output = " ".join(log.read_text().split())
    assert code == 1, output
    assert f"port {port} on 127.0.0.1 is in use" in output and "--port" in output
    assert "Traceback" not in output
