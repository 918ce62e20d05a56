"""Who may do what over HTTP: a bearer token for commands, another (or the same) for reads;
/health and /docs stay open. No database: the command bus and the view are stand-ins."""

import hmac
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from infra.http_api import auth as http_auth
from infra.http_api import create_app
from infra.settings import load_settings
from projections.view import Query, QueryParam, View

COMMAND_TOKEN = "cmd-Token-1"
READ_TOKEN = "read-Token-2"
PING = {"type": "Ping", "data": {}}


class Result:
    def __init__(self, command_id: str) -> None:
        self.command_id = command_id

    def to_json(self) -> dict[str, Any]:
        return {"status": "accepted", "command_id": self.command_id, "position_token": "p/1@1"}


class DownEngine:
    @contextmanager
    def connect(self) -> Iterator[None]:
        raise ConnectionError("no database in unit tests")
        yield


def echo_view() -> View:
    store: Any = SimpleNamespace(kind="memory", live_generation=lambda: "g1")
    query = Query(
        "echo",
        "/echo/{n}",
        (QueryParam("n", int, where="path", required=True),),
        lambda n: {"n": n},
        "Echo n.",
    )
    return View("echo", ("t",), "m:f", store, queries=(query,))  # type: ignore[arg-type]


def client(**tokens: str) -> TestClient:
    registry = SimpleNamespace(names=lambda: ["Ping"], decode=lambda kind, data: (kind, data))
    bus: Any = SimpleNamespace(
        registry=registry,
        send=lambda command, command_id: Result(command_id),
        store=SimpleNamespace(engine=DownEngine()),
    )
    settings = load_settings(**tokens)
    return TestClient(create_app(settings, views=[echo_view()], bus=bus, waiter=None))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_without_tokens_everything_is_open() -> None:
    api = client()
    assert api.post("/commands", json=PING).json()["status"] == "accepted"
    assert api.get("/echo/3").json() == {"n": 3}
    spec = api.get("/openapi.json").json()
    assert "securitySchemes" not in spec.get("components", {})
    assert "security" not in spec["paths"]["/commands"]["post"]


def test_commands_need_the_command_token() -> None:
    api = client(api_token=COMMAND_TOKEN)
    missing = api.post("/commands", json=PING)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer" in missing.json()["error"]
    basic = api.post("/commands", json=PING, headers={"Authorization": "Basic dXNlcjpwdw=="})
    assert basic.status_code == 401
    wrong = api.post("/commands", json=PING, headers=bearer("guessed-Token-3"))
    assert wrong.status_code == 403
    assert set(wrong.json()) == {"error"} and "guessed-Token-3" not in wrong.text
    assert api.post("/commands", json=PING, headers=bearer(COMMAND_TOKEN)).status_code == 200
    assert api.get("/echo/1").status_code == 200  # reads stay open without a read token


def test_reads_need_the_read_token_or_the_command_token() -> None:
    api = client(api_token=COMMAND_TOKEN, api_read_token=READ_TOKEN)
    missing = api.get("/echo/1")
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert api.get("/echo/1", headers=bearer("nope-Token-4")).status_code == 403
    assert api.get("/echo/1", headers=bearer(READ_TOKEN)).json() == {"n": 1}
    assert api.get("/echo/1", headers=bearer(COMMAND_TOKEN)).json() == {"n": 1}
    # The read token does not run commands.
    assert api.post("/commands", json=PING, headers=bearer(READ_TOKEN)).status_code == 403
    # Health and the docs stay open.
    assert api.get("/health").status_code == 503  # answered (the stand-in database is down)
    assert api.get("/docs").status_code == 200
    assert api.get("/openapi.json").status_code == 200


def test_only_reads_protected() -> None:
    api = client(api_read_token=READ_TOKEN)
    assert api.post("/commands", json=PING).status_code == 200
    assert api.get("/echo/1").status_code == 401
    assert api.get("/echo/1", headers=bearer(READ_TOKEN)).status_code == 200


def test_tokens_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def compare(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(http_auth.hmac, "compare_digest", compare)
    api = client(api_token=COMMAND_TOKEN, api_read_token=READ_TOKEN)
    assert api.get("/echo/1", headers=bearer(COMMAND_TOKEN)).status_code == 200
    # Compared with every accepted token, not only until the first match.
    assert {b for _, b in calls} == {READ_TOKEN.encode(), COMMAND_TOKEN.encode()}


def test_openapi_declares_the_bearer_scheme_on_protected_routes() -> None:
    spec = client(api_token=COMMAND_TOKEN, api_read_token=READ_TOKEN).get("/openapi.json").json()
    schemes = spec["components"]["securitySchemes"]
    assert {s["type"] for s in schemes.values()} == {"http"}
    assert {s["scheme"] for s in schemes.values()} == {"bearer"}
    command = spec["paths"]["/commands"]["post"]
    read = spec["paths"]["/echo/{n}"]["get"]
    assert command["security"] == [{"commandToken": []}]
    assert read["security"] == [{"readToken": []}]
    assert {"401", "403"} <= set(command["responses"]) & set(read["responses"])
    assert "security" not in spec["paths"]["/health"]["get"]


def test_forget_needs_the_command_token(monkeypatch: pytest.MonkeyPatch) -> None:
    from event_store.forgetting import ForgetResult
    from infra import forgetting

    calls: list[tuple[str, str]] = []

    def forget_subject(settings: Any, kind: str, subject_id: str) -> ForgetResult:
        calls.append((kind, subject_id))
        if subject_id == "404":
            return ForgetResult("unknown", kind, subject_id)
        return ForgetResult("forgotten", kind, subject_id, position=f"subject/{kind}-1@1")

    monkeypatch.setattr(forgetting, "forget_subject", forget_subject)
    api = client(api_token=COMMAND_TOKEN, api_read_token=READ_TOKEN)
    body = {"subject_type": "user", "subject_id": "42"}
    assert api.post("/forget", json=body).status_code == 401
    assert api.post("/forget", json=body, headers=bearer(READ_TOKEN)).status_code == 403
    assert calls == []  # refused before anything is forgotten
    done = api.post("/forget", json=body, headers=bearer(COMMAND_TOKEN))
    assert done.status_code == 200 and done.json()["status"] == "forgotten"
    assert done.json()["position_token"] == "subject/user-1@1" and calls == [("user", "42")]
    unknown = {"subject_type": "user", "subject_id": "404"}
    assert api.post("/forget", json=unknown, headers=bearer(COMMAND_TOKEN)).status_code == 404
    spec = api.get("/openapi.json").json()
    assert spec["paths"]["/forget"]["post"]["security"]
