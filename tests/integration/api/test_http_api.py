"""The HTTP API in process (TestClient) over real stores and a real event store: the view
queries, the commands, health, waiting for position tokens, and every error as JSON."""

import dataclasses
import threading
import time
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from connectors.postgres import PostgresConfig, make_engine
from event_store import CommandBus, EventStore
from examples.social import social_registry
from infra.errors import QueryDeclarationError
from infra.http_api import create_app, metrics_text
from projections.view import Query, QueryParam, View
from tests.integration.api.library import (
    NOTES,
    BatchWaiter,
    ViewsLaggingError,
    apply,
    build_views,
)
from tests.integration.conftest import Endpoints
from tests.integration.event_store.conftest import StoreEnv
from tributary.view_model import Put

CREATE_POST = {"type": "CreatePost", "data": {"post_id": 1, "author_id": 1, "text": "hi #api"}}


def error_of(response: httpx.Response, status: int) -> str:
    """The error text of a JSON error answer with ``status``."""
    assert response.status_code == status, response.text
    body = response.json()
    assert isinstance(body["error"], str) and body["error"]
    return str(body["error"])


def test_each_query_route_answers_from_its_view(client: TestClient, api_views: list[View]) -> None:
    assert client.get("/notes/1").json() == {"id": 1, "text": "first", "tags": ["a"]}
    assert [n["id"] for n in client.get("/notes", params={"tag": "a"}).json()] == [2, 1]
    assert [n["id"] for n in client.get("/notes?tag=b&limit=1").json()] == [3]
    counters = api_views[1].name
    assert client.get("/counters/visits").json() == {"name": "visits", "value": 7}
    assert counters.startswith("counters_")


def test_bad_arguments_are_422_refusals_400_and_missing_things_404(client: TestClient) -> None:
    assert "note_id" in error_of(client.get("/notes/abc"), 422)
    assert "greater than or equal to 1" in error_of(client.get("/notes/0"), 422)
    reason = error_of(client.get("/notes", params={"tag": "a", "limit": 500}), 422)
    assert "limit" in reason and "less than or equal to 50" in reason and "500" in reason
    assert "tag" in error_of(client.get("/notes"), 422)
    assert "timeout" in error_of(client.get("/notes/1", params={"timeout": -1}), 422)
    assert "one word" in error_of(client.get("/notes", params={"tag": "two words"}), 400)
    assert error_of(client.get("/notes/99"), 404) == "no note 99"
    assert "no counter 'nope'" in error_of(client.get("/counters/nope"), 404)
    assert "/nowhere" in error_of(client.get("/nowhere"), 404)
    assert "POST /notes/1" in error_of(client.post("/notes/1"), 405)


def test_health_checks_the_database_and_every_view_store(
    client: TestClient, api_views: list[View]
) -> None:
    response = client.get("/health")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "ok"
    assert set(body["checks"]) == {"database", *(f"view:{v.name}" for v in api_views)}
    notes = body["checks"][f"view:{NOTES}"]
    assert notes["status"] == "ok" and notes["store"] == "postgres" and notes["batch_id"] == 0


def test_metrics_give_each_view_its_batch_and_counters_in_prometheus_text(
    client: TestClient, api_views: list[View]
) -> None:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {
        (s.name, s.labels["view"]): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
        if "view" in s.labels  # serve's other metrics (process, commands, verify) have none
    }
    assert samples[("tributary_view_up", NOTES)] == 1
    assert samples[("tributary_view_batch_id", NOTES)] == 0
    counted = dataclasses.replace(api_views[0], metrics=lambda: {"late_events": 3})
    unreachable = dataclasses.replace(api_views[0], name='a "b"', metrics=lambda: 1 // 0)
    families = {
        family.name: (family.type, [(s.name, s.labels, s.value) for s in family.samples])
        for family in text_string_to_metric_families(metrics_text([counted, unreachable]))
    }
    assert families == {
        "tributary_view_up": (
            "gauge",
            [
                ("tributary_view_up", {"view": NOTES}, 1),
                ("tributary_view_up", {"view": 'a "b"'}, 0),
            ],
        ),
        "tributary_view_batch_id": (
            "gauge",
            [("tributary_view_batch_id", {"view": NOTES}, 0)],
        ),
        "tributary_view_late_events": (
            "unknown",
            [("tributary_view_late_events", {"view": NOTES}, 3)],
        ),
    }


def test_min_position_waits_until_the_views_applied_it(
    client: TestClient, api_views: list[View], waiter: BatchWaiter
) -> None:
    notes = api_views[0].store
    assert error_of(client.get("/notes/4"), 404) == "no note 4"

    def later() -> None:
        time.sleep(0.5)
        apply(notes, 1, [Put(NOTES, "4", 4, {"text": "fourth", "tags": []})])

    writer = threading.Thread(target=later)
    started = time.monotonic()
    writer.start()
    try:
        response = client.get("/notes/4", params={"min_position": "notes@1", "timeout": 20})
    finally:
        writer.join()
    assert response.status_code == 200, response.text
    assert response.json()["text"] == "fourth" and time.monotonic() - started >= 0.5
    assert waiter.tokens == ["notes@1"]

    lagging = client.get("/notes/1", params={"min_position": "notes@7", "timeout": 0.3})
    assert "notes" in error_of(lagging, 504) and lagging.json()["lagging"] == ["notes"]
    assert "not a position token" in error_of(client.get("/notes/1?min_position=junk"), 400)


def test_commands_accepted_rejected_and_repeated(client: TestClient, env: StoreEnv) -> None:
    accepted = client.post("/commands", json=CREATE_POST)
    assert accepted.status_code == 200, accepted.text
    body = accepted.json()
    assert body["status"] == "accepted" and body["version"] == 1 and body["command_id"]
    assert body["position_token"] == f"post/{body['stream_id']}@1"
    assert env.count_events() == 1

    again = client.post("/commands", json={**CREATE_POST, "command_id": body["command_id"]})
    assert again.status_code == 200 and again.json() == body
    assert env.count_events() == 1

    unknown_author = {"type": "CreatePost", "data": {"post_id": 2, "author_id": 99, "text": "x"}}
    rejected = client.post("/commands", json=unknown_author)
    assert rejected.status_code == 200, rejected.text
    assert rejected.json()["status"] == "rejected" and "no user 99" in rejected.json()["reason"]
    assert env.count_events() == 1


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"data": {}}', "type is missing"),
        (b'{"type": "CreatePost"}', "data is missing"),
        (b'{"type": "CreatePost", "data": [1]}', "data must be a JSON object"),
        (b'{"type": "CreatePost", "data": {}, "command_id": ""}', "command_id"),
        (b'{"type": "CreatePost", "data": {}, "extra": 1}', "unknown envelope fields: extra"),
        (b'{"type": "Nope", "data": {}}', "unknown command type 'Nope'"),
        (
            b'{"type": "CreatePost", "data": {"post_id": "1", "author_id": 1, "text": "t"}}',
            "post_id",
        ),
        (b'{"type": "CreatePost", "data": {"post_id": 1}}', "author_id"),
        (
            b'{"type": "CreatePost", "data": {"post_id": 1, "author_id": 1, "text": "t", "x": 1}}',
            "unknown fields x",
        ),
    ],
)
def test_a_malformed_command_is_422_and_appends_nothing(
    client: TestClient, env: StoreEnv, body: bytes, reason: str
) -> None:
    response = client.post("/commands", content=body, headers={"content-type": "application/json"})
    assert reason in error_of(response, 422)
    assert env.count_events() == 0


class RecordingWaiter:
    """Stand-in waiter for commands: records tokens; lags when ``lagging`` is set."""

    def __init__(self, lagging: tuple[str, ...] = ()) -> None:
        self.lagging = lagging
        self.calls: list[tuple[str, float]] = []

    def wait(self, token: str, timeout: float) -> None:
        self.calls.append((token, timeout))
        if self.lagging:
            raise ViewsLaggingError(token, self.lagging)


def test_wait_views_waits_for_the_commands_position_token(
    stack: Endpoints, api_views: list[View], env: StoreEnv
) -> None:
    on_time, late = RecordingWaiter(), RecordingWaiter(("timeline", "search"))
    with TestClient(
        create_app(stack.settings, views=api_views, bus=env.bus(), waiter=on_time)
    ) as c:
        body = c.post("/commands?wait_views=true&timeout=3", json=CREATE_POST).json()
        assert on_time.calls == [(body["position_token"], 3.0)]
        c.post("/commands", json={**CREATE_POST, "data": {**CREATE_POST["data"], "post_id": 9}})
        assert len(on_time.calls) == 1  # no wait_views: no wait
    with TestClient(create_app(stack.settings, views=api_views, bus=env.bus(), waiter=late)) as c:
        edit = {"type": "EditPost", "data": {"post_id": 1, "text": "edited"}}
        response = c.post("/commands", params={"wait_views": "true"}, json=edit)
        reason = error_of(response, 504)
        assert "timeline, search" in reason and response.json()["lagging"] == ["timeline", "search"]
        assert response.json()["result"]["status"] == "accepted"  # stored: only the views lag
    assert env.count_events() == 3


def test_an_unreachable_store_or_database_is_503_never_an_answer(
    stack: Endpoints, views_schema: str, closed_port: int
) -> None:
    _, down_counters = build_views(
        stack.postgres_dsn, views_schema, f"redis://127.0.0.1:{closed_port}/0"
    )
    [down_notes, _] = build_views(
        f"postgresql://postgres@127.0.0.1:{closed_port}/tributary", views_schema, stack.redis_url
    )
    views = [down_notes, down_counters]
    url = f"postgresql+psycopg://postgres@127.0.0.1:{closed_port}/tributary"
    bus = CommandBus(EventStore(make_engine(PostgresConfig(url)), "es_down"), social_registry())
    app = create_app(stack.settings, views=views, bus=bus, waiter=BatchWaiter(views))
    with TestClient(app) as client:
        assert "Redis unreachable" in error_of(client.get("/counters/visits"), 503)
        assert "PostgreSQL unreachable" in error_of(client.get("/notes/1"), 503)
        waiting = client.get("/notes/1?min_position=notes@0")
        assert "PostgreSQL unreachable" in error_of(waiting, 503)

        health = client.get("/health")
        reason = error_of(health, 503)
        assert "database" in reason and f"view:{down_counters.name}" in reason
        checks = health.json()["checks"]
        assert {name for name, c in checks.items() if c["status"] == "error"} == set(checks)

        assert "not handled" in error_of(client.post("/commands", json=CREATE_POST), 503)
        assert "unknown command type" in error_of(
            client.post("/commands", json={"type": "Nope", "data": {}}), 422
        )


def test_openapi_documents_every_route(client: TestClient) -> None:
    spec: dict[str, Any] = client.get("/openapi.json").json()
    paths = spec["paths"]
    assert {"/commands", "/health", "/notes/{note_id}", "/notes", "/counters/{name}"} <= set(paths)
    note = paths["/notes/{note_id}"]["get"]
    assert note["summary"] == "One note by its id."
    assert note["operationId"] == "query_note"
    assert {"404", "422", "503", "504"} <= set(note["responses"])
    params = {p["name"]: p for p in paths["/notes"]["get"]["parameters"]}
    assert params["tag"]["required"] is True and params["tag"]["in"] == "query"
    assert params["limit"]["schema"]["maximum"] == 50 and params["limit"]["schema"]["default"] == 10
    assert {"min_position", "timeout"} <= set(params)
    assert paths["/notes/{note_id}"]["get"]["parameters"][0]["in"] == "path"
    envelope = paths["/commands"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert (
        envelope["required"] == ["type", "data"]
        and "CreatePost" in (envelope["properties"]["type"]["enum"])
    )
    docs = client.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


def test_queries_that_cannot_be_served_together_are_refused(
    stack: Endpoints, api_views: list[View], env: StoreEnv
) -> None:
    notes = api_views[0]
    twin = View("twin", (), notes.fold, notes.store, queries=(notes.queries[0],))
    with pytest.raises(QueryDeclarationError, match="'note' is declared by views notes and twin"):
        create_app(stack.settings, views=[notes, twin], bus=env.bus())
    bad = Query("bad", "/bad/{id}", (QueryParam("other", int, where="path"),), lambda other: 1)
    wrong = View("wrong", (), notes.fold, notes.store, queries=(bad,))
    with pytest.raises(QueryDeclarationError, match="placeholders"):
        create_app(stack.settings, views=[wrong], bus=env.bus())


def test_a_bug_in_a_query_is_a_json_500(
    stack: Endpoints, api_views: list[View], env: StoreEnv
) -> None:
    def explode() -> None:
        raise RuntimeError("bug")

    notes = api_views[0]
    buggy = View(
        "buggy", (), notes.fold, notes.store, queries=(Query("boom", "/boom", (), explode),)
    )
    app = create_app(stack.settings, views=[buggy], bus=env.bus())
    with TestClient(app, raise_server_exceptions=False) as client:
        assert "RuntimeError" in error_of(client.get("/boom"), 500)


def test_the_default_waiter_is_spark_streamings_view_waiter(
    stack: Endpoints, api_views: list[View], env: StoreEnv
) -> None:
    with TestClient(create_app(stack.settings, views=api_views, bus=env.bus())) as client:
        assert "not a position token" in error_of(client.get("/notes/1?min_position=junk"), 400)
        # No view here reads events.post: there is nothing to wait for.
        waited = client.get("/notes/1", params={"min_position": "post/post-1@1", "timeout": 1})
        assert waited.status_code == 200 and waited.json()["id"] == 1


def test_the_dashboards_sampler_stops_with_the_app(
    stack: Endpoints, api_views: list[View], env: StoreEnv
) -> None:
    def samplers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "overview" and t.is_alive()]

    before = set(samplers())
    app = create_app(stack.settings, views=api_views, bus=env.bus())
    with TestClient(app) as client:
        assert client.get("/ui/state").status_code == 200
        started = set(samplers()) - before
        assert len(started) == 1  # the open dashboard is sampled in the background
    deadline = time.monotonic() + 10
    while started & set(samplers()):
        assert time.monotonic() < deadline, "the sampler outlived the app"
        time.sleep(0.1)
