"""Without Ryuk, a run killed before its clean-up leaves containers; the next run's start
removes exactly those whose owner process on this host is gone."""

import socket
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from infra.containers import stack as container_stack
from infra.containers.stack import OWNER_LABEL, ROLE_LABEL, STACK_LABEL, reap_orphans


@dataclass
class FakeContainer:
    id: str
    labels: dict[str, str]
    removed: bool = False
    joined_by: list["FakeContainer"] = field(default_factory=list)

    def remove(self, force: bool = False, v: bool = False) -> None:
        if any(not c.removed for c in self.joined_by):  # as the engines refuse it
            raise RuntimeError(f"{self.id} has dependent containers")
        self.removed = True


@dataclass
class FakeClient:
    all: list[FakeContainer] = field(default_factory=list)

    @property
    def containers(self) -> "FakeClient":
        return self

    def list(self, all: bool, filters: dict[str, list[str]]) -> list[FakeContainer]:
        assert filters == {"label": [STACK_LABEL]}
        return [c for c in self.all if STACK_LABEL in c.labels]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_containers_of_dead_owners_on_this_host_are_removed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = socket.gethostname()
    dead, alive = (
        _dead_pid(),
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]),
    )
    try:
        client = FakeClient(
            [
                FakeContainer("dead", {STACK_LABEL: "a", OWNER_LABEL: f"{host}:{dead}"}),
                FakeContainer("alive", {STACK_LABEL: "b", OWNER_LABEL: f"{host}:{alive.pid}"}),
                FakeContainer("other-host", {STACK_LABEL: "c", OWNER_LABEL: f"elsewhere:{dead}"}),
                FakeContainer("up", {STACK_LABEL: "d", OWNER_LABEL: "tributary-up"}),
                FakeContainer("not-ours", {"other": "x"}),
            ]
        )
        monkeypatch.setattr(container_stack, "docker_client", lambda: client)
        assert reap_orphans() == ["dead"]
        assert [c.id for c in client.all if c.removed] == ["dead"]
    finally:
        alive.kill()
        alive.wait()


def test_a_namespace_holder_is_removed_after_the_containers_that_joined_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner = {STACK_LABEL: "s", OWNER_LABEL: f"{socket.gethostname()}:{_dead_pid()}"}
    postgres = FakeContainer("postgres", {**owner, ROLE_LABEL: "postgres"})
    holder = FakeContainer("net", {**owner, ROLE_LABEL: "net"}, joined_by=[postgres])
    client = FakeClient([holder, postgres])  # the engine lists the holder first
    monkeypatch.setattr(container_stack, "docker_client", lambda: client)
    assert reap_orphans() == ["postgres", "net"]
    assert holder.removed and postgres.removed
