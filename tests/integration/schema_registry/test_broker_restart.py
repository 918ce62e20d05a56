"""The registry's store survives a SIGTERM of the broker under it, then a registry restart.

The session's broker is shared by the whole suite, so this test runs a broker of its own: a
second Tansu on the module's SeaweedFS (``s3_stack``), in a bucket of its own, started, stopped
(SIGTERM) and started again by ``BrokerService`` exactly as the stack runs its broker. The
registry runs in this process on the broker's ``_schemas`` topic, as in the other registry tests.
"""

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from connectors.kafka import KafkaConfig
from connectors.kafka.reading import read_topic
from connectors.schema_registry.client import CONTENT_TYPE
from connectors.schema_registry.store import DEFAULT_TOPIC
from infra.stack.broker import BrokerService
from infra.stack.isolated import free_port_block
from infra.stack.process import stop_pid
from tests.integration.conftest import Endpoints
from tests.integration.schema_registry.serving import RunningRegistry

HEADERS = {"Content-Type": CONTENT_TYPE}
START_TIMEOUT_S = 30.0


def record(name: str, *fields: str) -> str:
    """A record schema whose fields are optional strings (any two of them are compatible)."""
    return json.dumps(
        {
            "type": "record",
            "name": name,
            "namespace": "io.tributary.restart",
            "fields": [{"name": f, "type": ["null", "string"], "default": None} for f in fields],
        }
    )


@pytest.fixture
def own_broker(s3_stack: Endpoints, tmp_path: Path, unique: str) -> Iterator[BrokerService]:
    """A broker of this test's own on the module's object store, in its own bucket."""
    if s3_stack.local is None:
        pytest.skip("the session uses services named in the environment: no broker to restart")
    store = s3_stack.local.objectstore
    bucket = f"registry-restart-{unique}"
    store.create_bucket(bucket)
    broker = BrokerService(tmp_path / "home", free_port_block(1), store, bucket)
    try:
        broker.wait_ready(broker.start(), s3_stack.settings.start_timeout_s)
        yield broker
    finally:
        broker.stop()
        store.delete_bucket(bucket)


class Rest:
    """The registry's REST API, answers checked."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, headers=HEADERS, timeout=30)

    def call(self, method: str, path: str, body: object = None, **params: str) -> Any:
        answer = self.http.request(method, path, json=body, params=params)
        assert answer.status_code == 200, f"{method} {path}: {answer.status_code} {answer.text}"
        return answer.json()

    def register(self, subject: str, schema: str) -> int:
        return int(self.call("POST", f"/subjects/{subject}/versions", {"schema": schema})["id"])

    def snapshot(self) -> dict[str, Any]:
        """Everything a client can read, soft-deleted versions included."""
        subjects = sorted(self.call("GET", "/subjects", deleted="true"))
        out: dict[str, Any] = {
            "subjects": sorted(self.call("GET", "/subjects")),
            "config": self.call("GET", "/config"),
        }
        ids: set[int] = set()
        for subject in subjects:
            versions = self.call("GET", f"/subjects/{subject}/versions", deleted="true")
            live = self.http.get(f"/subjects/{subject}/versions")
            level = self.http.get(f"/config/{subject}")
            entries = [
                self.call("GET", f"/subjects/{subject}/versions/{v}", deleted="true")
                for v in versions
            ]
            ids.update(e["id"] for e in entries)
            out[subject] = {
                "versions": entries,
                "live": (live.status_code, live.json()),
                "config": (level.status_code, level.json()),
            }
        for schema_id in sorted(ids):
            out[f"id {schema_id}"] = {
                "schema": self.call("GET", f"/schemas/ids/{schema_id}"),
                "versions": self.call("GET", f"/schemas/ids/{schema_id}/versions", deleted="true"),
            }
        return out


def test_the_store_survives_a_broker_sigterm_and_a_registry_restart(
    own_broker: BrokerService, unique: str
) -> None:
    kafka = KafkaConfig(own_broker.endpoint(), client_id="tributary-test")
    first = RunningRegistry(kafka, DEFAULT_TOPIC)
    try:
        rest = Rest(first.url)
        a, b, c = (f"{name}-{unique}-value" for name in ("a", "b", "c"))
        ids = {
            (a, 1): rest.register(a, record("A", "x")),
            (a, 2): rest.register(a, record("A", "x", "y")),
            (b, 1): rest.register(b, record("A", "x")),  # the same schema: a's id
            (b, 2): rest.register(b, record("A", "z")),
            (c, 1): rest.register(c, record("C")),
        }
        assert ids[(b, 1)] == ids[(a, 1)] and len(set(ids.values())) == 4
        rest.call("PUT", f"/config/{a}", {"compatibility": "FULL_TRANSITIVE"})
        rest.call("PUT", "/config", {"compatibility": "NONE"})
        assert rest.call("DELETE", f"/subjects/{b}/versions/1") == 1
        assert rest.call("DELETE", f"/subjects/{c}") == [1]
        before = rest.snapshot()
        assert before["subjects"] == sorted([a, b])
        assert before[b]["live"] == (200, [2])
        assert before[c]["live"][0] == 404 and before[c]["versions"][0]["id"] == ids[(c, 1)]
        assert before[a]["config"] == (200, {"compatibilityLevel": "FULL_TRANSITIVE"})
        assert json.loads(before[a]["versions"][1]["schema"]) == json.loads(record("A", "x", "y"))
        records = read_topic(kafka, DEFAULT_TOPIC)

        # The stack's way: SIGTERM, wait for the process to end, start it again on its port.
        pid = own_broker.pid()
        assert pid is not None
        assert stop_pid(pid, signal.SIGTERM, own_broker.stop_timeout), "SIGTERM did not stop it"
        own_broker.pidfile.clear()
        own_broker.wait_ready(own_broker.start(), START_TIMEOUT_S)
        assert read_topic(kafka, DEFAULT_TOPIC) == records, "the broker lost or changed records"

        # The registry that ran through the broker's restart reads and writes through it.
        assert rest.snapshot() == before
        f = f"f-{unique}-value"
        highest = max(ids.values())
        assert highest == ids[(c, 1)]  # the highest id so far is a soft-deleted subject's
        ids[(f, 1)] = rest.register(f, record("F"))
        assert ids[(f, 1)] > highest, "a new schema reused an id"
        before = rest.snapshot()
        rest.http.close()
    finally:
        first.stop()

    second = RunningRegistry(kafka, DEFAULT_TOPIC)
    try:
        rest = Rest(second.url)
        assert rest.snapshot() == before
        fresh = rest.register(f"d-{unique}-value", record("D", "w"))
        assert fresh > max(ids.values()), "a new schema reused an id"
        assert rest.register(f"e-{unique}-value", record("A", "z")) == ids[(b, 2)]
        stored = rest.call("GET", f"/schemas/ids/{fresh}")["schema"]
        assert json.loads(stored) == json.loads(record("D", "w"))
        rest.http.close()
    finally:
        second.stop()
