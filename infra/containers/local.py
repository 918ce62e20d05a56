"""`tributary up --containers`: the local stack as containers of the repository's images, on
the same settings (ports, state folder) as the processes. The state folder records the mode
(``containers.json``), so `status`, `down` and a later `up` act on the containers.

`down` stops the containers (their data stays in them); `up` starts them again; `down --purge`
removes them. Their owner label names no process: `reap_orphans` leaves them alone."""

import contextlib
import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from infra.settings import Settings
    from infra.stack import ComponentStatus

STATE_FILE = "containers.json"
SERVICES = ("postgres", "redis", "broker", "registry")  # the roles `status` reports
START_ORDER = ("net", "postgres", "redis", "broker", "registry")
OWNER = "tributary-up"


def state_path(settings: "Settings") -> Path:
    return settings.home.resolve() / STATE_FILE


def recorded(settings: "Settings") -> dict[str, Any] | None:
    """The containers stack recorded in the state folder, or None (processes mode)."""
    try:
        loaded: dict[str, Any] = json.loads(state_path(settings).read_text())
        return loaded
    except (OSError, ValueError):
        return None


def stack_id_for(settings: "Settings") -> str:
    digest = hashlib.sha256(str(settings.home.resolve()).encode()).hexdigest()[:10]
    return f"tributary-up-{digest}"


def _containers(stack_id: str) -> dict[str, Any]:
    from infra.containers.stack import ROLE_LABEL, STACK_LABEL, docker_client

    found = docker_client().containers.list(
        all=True, filters={"label": [f"{STACK_LABEL}={stack_id}"]}
    )
    return {c.labels.get(ROLE_LABEL, c.name): c for c in found}


def up(settings: "Settings") -> list["ComponentStatus"]:
    """Start the stack's containers (create them the first time); idempotent."""
    from infra.containers.engine import detect_engine
    from infra.containers.stack import ContainerStack, configure_client_env

    configure_client_env()
    state = recorded(settings)
    helper = ContainerStack(settings, stack_id=stack_id_for(settings), owner=OWNER)
    existing = _containers(state["stack_id"]) if state else {}
    if existing:
        for role in START_ORDER:
            container = existing.get(role)
            if container is None:
                continue
            container.reload()
            if container.status != "running":
                container.start()
            if role in SERVICES:
                deadline = time.monotonic() + settings.start_timeout_s
                while not helper.ready(role) and time.monotonic() < deadline:
                    time.sleep(0.2)
        return status(settings)
    helper.up()
    settings.home.mkdir(parents=True, exist_ok=True)
    state_path(settings).write_text(
        json.dumps(
            {
                "stack_id": helper.stack_id,
                "engine": detect_engine().binary,
                "images": helper.images,
                "started_in_s": round(helper.start_seconds, 1),
            }
        )
    )
    return status(settings)


def status(settings: "Settings") -> list["ComponentStatus"]:
    from infra.containers.stack import ContainerStack, configure_client_env
    from infra.stack import ComponentStatus

    state = recorded(settings) or {}
    configure_client_env()
    helper = ContainerStack(settings, stack_id=str(state.get("stack_id")), owner=OWNER)
    existing = _containers(helper.stack_id)
    endpoints = {
        "postgres": settings.database_url.replace("+psycopg", ""),
        "redis": f"redis://127.0.0.1:{settings.redis_port}/0",
        "broker": f"127.0.0.1:{settings.broker_port}",
        "registry": f"http://127.0.0.1:{settings.schema_registry_port}",
    }
    out = []
    for role in SERVICES:
        container = existing.get(role)
        running = container is not None and container.status == "running"
        state_now: Literal["up", "down"] = "up" if running and helper.ready(role) else "down"
        endpoint = endpoints[role] + (f" ({container.short_id})" if container else "")
        name = "schema-registry" if role == "registry" else role
        out.append(ComponentStatus(name, state_now, endpoint, None, mode="containers"))
    return out


def down(settings: "Settings", purge: bool = False) -> None:
    """Stop the containers (graceful: the broker keeps what it acknowledged); with ``purge``
    remove them and the record of the mode."""
    from infra.containers.stack import configure_client_env

    state = recorded(settings)
    if state is None:
        return
    configure_client_env()
    existing = _containers(str(state["stack_id"]))
    for role in reversed(START_ORDER):
        container = existing.get(role)
        if container is None:
            continue
        with contextlib.suppress(Exception):
            if role == "net":  # `sleep` as PID 1 ignores SIGTERM; it holds nothing
                container.kill()
            else:
                container.stop(timeout=30)
        if purge:
            with contextlib.suppress(Exception):
                container.remove(force=True, v=True)
    if purge:
        state_path(settings).unlink(missing_ok=True)
