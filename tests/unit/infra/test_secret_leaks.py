"""Passwords and tokens never leave the process: not in the CLI's output (``status``,
``views``, ``cdc-status``, ``connector-config``, ``query``, errors), not in the HTTP API's error
bodies, not in log files. Every service is pointed at a closed port with a recognisable secret
in its URL, so each command takes its error path; one PostgreSQL password has a space, which
libpq echoes back in its error ("unexpected spaces found in ...")."""

import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from infra.http_api import create_app
from infra.settings import load_settings
from infra.stack.isolated import free_port_block
from tests.leaks import (
    COMMAND_TOKEN,
    KEYSTORE,
    PG,
    PG_ECHOED,
    READ_TOKEN,
    REDIS,
    SASL,
    cli,
    leaked,
    secret_env,
    secret_settings,
)

# Each command, the exit status it ends with and what its output holds when it took its own
# path (not an early failure that prints nothing or a traceback): the reports exit 0 with
# the services down, the commands needing one exit 1 with an `error:` line saying why.
COMMANDS = {
    "status": (0, "part:cdc"),
    "status --json": (0, '"name": "cdc"'),
    "views": (1, "error: cannot reach Kafka"),
    "views --json": (1, "error: cannot reach Kafka"),
    "cdc-status": (0, "not started"),
    "cdc-status --json": (0, '"state": "not started"'),
    "connector-config": (0, '"database.password": "${file:'),
    "query timeline 1": (1, "error: unavailable: timeline store unreachable"),  # read-only URL
    "query profile 1": (1, "error: unavailable: view profile: Redis unreachable"),
    "snapshot public.users": (1, "error: cannot write the snapshot signal"),
}


@pytest.mark.parametrize("pg_password", [PG, PG_ECHOED], ids=["plain", "echoed"])
def test_cli_output_never_holds_a_secret(tmp_path: Path, pg_password: str) -> None:
    env = secret_env(tmp_path / "home", free_port_block(1), pg_password)
    running = {args: cli(args, env) for args in COMMANDS}  # in parallel: Kafka times out
    outputs = {}
    for args, process in running.items():
        out, err = process.communicate(timeout=180)
        outputs[args] = (process.returncode, out + err)
    for args, (code, text) in outputs.items():
        assert not leaked(text), f"`tributary {args}` printed {leaked(text)}:\n{text}"
        # Each command really took its path (not a crash, nor an early failure printing nothing).
        expected_code, expected_text = COMMANDS[args]
        assert (code, expected_text in text) == (expected_code, True), f"`{args}`:\n{text}"
        assert "Traceback" not in text, f"`tributary {args}` crashed:\n{text}"
    if pg_password == PG_ECHOED:  # libpq refused the URL quoting the password: masked
        assert 'unexpected spaces found in "***"' in outputs["snapshot public.users"][1]


def test_connector_config_shows_the_database_password_only_when_asked(tmp_path: Path) -> None:
    env = secret_env(tmp_path / "home", free_port_block(1))
    outputs = []
    for args in ("connector-config", "connector-config --show-password"):
        process = cli(args, env)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, f"`tributary {args}` failed:\n{err}"
        assert '"database.password": ' in out, out
        outputs.append(out)
    hidden, shown = outputs
    assert not leaked(hidden)
    assert '"database.password": "${file:' in hidden
    assert PG in shown
    assert leaked(shown) == [PG]  # Kafka's credentials belong to the Connect worker


def test_invalid_settings_are_reported_without_their_values(tmp_path: Path) -> None:
    env = secret_env(tmp_path / "home", free_port_block(1))
    bad_extra = {**env, "TRIBUTARY_KAFKA_EXTRA": f"ssl.keystore.password:{KEYSTORE}"}
    # pydantic's own message would quote every input, the URLs and tokens included
    no_protocol = {k: v for k, v in env.items() if k != "TRIBUTARY_KAFKA_SECURITY_PROTOCOL"}
    for broken, variable in (
        (bad_extra, "TRIBUTARY_KAFKA_EXTRA"),
        (no_protocol, "TRIBUTARY_KAFKA_SECURITY_PROTOCOL"),
    ):
        process = cli("connector-config", broken)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 1
        assert "invalid settings" in err and variable in err
        assert not leaked(out + err), err


def test_api_error_bodies_never_hold_a_secret(tmp_path: Path) -> None:
    port = free_port_block(1)
    settings = load_settings(**secret_settings(tmp_path, port))
    reads = {"Authorization": f"Bearer {READ_TOKEN}"}
    commands = {"Authorization": f"Bearer {COMMAND_TOKEN}"}
    create_post = {"type": "CreatePost", "data": {"post_id": 1, "author_id": 1, "text": "x"}}
    for url in (settings.postgres_url, f"postgresql+psycopg://app:{PG_ECHOED}@127.0.0.1:{port}/db"):
        app = create_app(settings.model_copy(update={"postgres_url": url}))
        with TestClient(app, raise_server_exceptions=False) as api:
            answers = [
                api.get("/timeline/1", headers=reads),
                api.get("/profile/1", headers=reads),
                api.get("/search?q=kafka", headers=reads),
                api.get("/timeline/1", headers={"Authorization": f"Bearer {SASL}"}),
                api.get("/health"),
                api.post("/commands", json=create_post, headers=commands),
                api.post("/commands", json=create_post, headers=reads),
                api.get(f"/nowhere/{REDIS}"),
            ]
        for answer in answers:
            text = answer.text + str(answer.headers)
            assert not leaked(text), f"{answer.request.url}: {text}"
        assert [a.status_code for a in answers][3:] == [403, 503, 503, 403, 404]
    assert answers[0].status_code in (500, 503)


# -- log files ---------------------------------------------------------------------------


def _processes_of(home: Path) -> list[int]:
    """PIDs whose environment names this test's state folder (the supervisor's children)."""
    marker = f"TRIBUTARY_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "home"
    yield folder
    for pid in _processes_of(folder):  # whatever a failed test left running
        os.kill(pid, signal.SIGKILL)


def _get(url: str, headers: dict[str, str], data: bytes | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_log_files_of_supervised_components_never_hold_a_secret(home: Path) -> None:
    """`tributary run api commands`: the processor fails against the database (with libpq
    echoing the password) and is restarted; the API logs each request and a 500's traceback."""
    api_port = free_port_block(1)
    env = {**secret_env(home, free_port_block(1), PG_ECHOED), "TRIBUTARY_API_PORT": str(api_port)}
    supervisor = cli("run api commands", env, start_new_session=True)
    base = f"http://127.0.0.1:{api_port}"
    reads = {"Authorization": f"Bearer {READ_TOKEN}"}
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                _get(f"{base}/health", {})
                break
            except OSError:
                assert time.monotonic() < deadline, "the API did not start"
                time.sleep(0.5)
        answers = [
            _get(f"{base}/timeline/1?probe={COMMAND_TOKEN}", reads),
            _get(f"{base}/profile/1", reads),
            _get(f"{base}/timeline/1", {"Authorization": f"Bearer {SASL}"}),
            _get(f"{base}/commands", {"Authorization": f"Bearer {COMMAND_TOKEN}"}, b"{}"),
            _get(f"{base}/health", {}),
        ]
        logs = home / "logs"
        while "Traceback" not in _read(logs / "run-commands.log"):
            assert time.monotonic() < deadline, "the command processor did not fail yet"
            time.sleep(0.5)
    finally:
        os.kill(supervisor.pid, signal.SIGTERM)
        out, err = supervisor.communicate(timeout=120)
    assert supervisor.returncode == 0
    assert not _processes_of(home)
    for _, body in answers:
        assert not leaked(body), body
    files = {p.name: _read(p) for p in logs.iterdir()}
    for name, text in {**files, "stdout": out, "stderr": err}.items():
        assert not leaked(text), f"{name} holds {leaked(text)}:\n{text}"
    api_log = files["run-api.log"]
    assert "/timeline/1?probe=*** HTTP/1.1" in api_log  # the access log line, masked
    processor = files["run-commands.log"]  # the processor's traceback (psycopg or SQLAlchemy)
    assert "Connection refused" in processor or 'unexpected spaces found in "***"' in processor
    assert 'unexpected spaces found in \\"***\\"' in answers[-1][1]  # libpq's echo, masked


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
