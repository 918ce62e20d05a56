"""The stack's services as containers, started through the engine's API with testcontainers.

All containers of a stack share one network namespace, held by a small container that
publishes every port: inside it each service listens on the port its setting names, so the
host reaches ``127.0.0.1:<port>`` exactly as with the local processes, the broker advertises
the address both sides use, and the registry and the CDC container reach the broker and
PostgreSQL on ``127.0.0.1`` too. Works on Docker (Linux or Desktop: published ports) and on
podman through its Docker-compatible API service (``make podman-setup``).

Every container carries the labels ``org.tributary.stack`` (this stack's id) and
``org.tributary.owner`` (``<host>:<pid>`` of the process that started it). ``down`` removes
them by id; :func:`reap_orphans` removes those whose owner process on this host is gone (a
run killed before it could clean up). Ryuk is not used: it needs an image from a registry."""

import contextlib
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from infra.errors import StartTimeoutError
from tributary.processes import pid_exists

if TYPE_CHECKING:
    from docker import DockerClient
    from testcontainers.core.container import DockerContainer

    from infra.settings import Settings

STACK_LABEL = "org.tributary.stack"
OWNER_LABEL = "org.tributary.owner"
ROLE_LABEL = "org.tributary.role"


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def configure_client_env() -> None:
    """What testcontainers needs here: podman-setup's variables (when no Docker host is named
    and podman is the engine), and never Ryuk (its image needs a registry; we clean up)."""
    from infra.containers.engine import detect_engine

    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    detect_engine()  # loads podman's env file when podman is the engine


def docker_client() -> "DockerClient":
    from testcontainers.core.docker_client import DockerClient as TcClient

    return TcClient().client


@dataclass
class ContainerStack:
    """PostgreSQL, Redis, the broker (memory or S3 with its object store inside) and the
    schema registry, each a container of its image, on the ports of ``settings``."""

    settings: "Settings"
    stack_id: str = field(default_factory=lambda: f"tributary-{uuid.uuid4().hex[:12]}")
    images: dict[str, str] = field(default_factory=dict)
    containers: dict[str, "DockerContainer"] = field(default_factory=dict)
    start_seconds: float = 0.0  # from the first container's creation to the registry's answer
    images_seconds: float = 0.0  # finding (or building) the images first
    # ``<host>:<pid>`` of the process whose end makes its containers orphans (reap_orphans);
    # `tributary up --containers` gives a name without a PID: its stack outlives the command.
    owner: str = field(default_factory=owner_id)

    # -- what runs --------------------------------------------------------------------------

    def ports(self) -> list[int]:
        s = self.settings
        ports = [s.postgres_port, s.redis_port, s.broker_port, s.schema_registry_port]
        if s.broker_storage == "s3":
            ports.append(s.objectstore_port)
        return ports

    def labels(self, role: str) -> dict[str, str]:
        return {STACK_LABEL: self.stack_id, OWNER_LABEL: self.owner, ROLE_LABEL: role}

    def _container(self, role: str, image: str) -> "DockerContainer":
        from testcontainers.core.container import DockerContainer

        container = DockerContainer(image).with_name(f"{self.stack_id}-{role}")
        container.with_kwargs(labels=self.labels(role))
        return container

    def _in_namespace(self, role: str, image: str) -> "DockerContainer":
        holder = self.containers["net"].get_container_id()
        container = self._container(role, image)
        kwargs = {"labels": self.labels(role), "network_mode": f"container:{holder}"}
        container.with_kwargs(**kwargs)
        return container

    def up(self) -> None:
        """Start every service and wait until each answers; on any failure remove what started."""
        from infra.containers.images import build_images

        configure_client_env()
        reap_orphans()
        if not self.images:  # each found by its inputs' hash (built when missing)
            checked = time.monotonic()
            self.images = {name: b.ref for name, b in build_images().items()}
            self.images_seconds = time.monotonic() - checked
        started = time.monotonic()
        s = self.settings
        try:
            net = self._container("net", self.images["redis"])
            net.with_kwargs(labels=self.labels("net"), entrypoint=["sleep", "infinity"])
            # published on the host's loopback only (trust authentication inside), same number
            published = cast(dict[str, Any], net.ports)
            for port in self.ports():
                published[f"{port}/tcp"] = ("127.0.0.1", port)
            self._start("net", net)
            pg = self._in_namespace("postgres", self.images["postgres"])
            pg.with_env("PGPORT", str(s.postgres_port))
            self._start("postgres", pg)
            redis = self._in_namespace("redis", self.images["redis"])
            redis.with_env("REDIS_PORT", str(s.redis_port))
            self._start("redis", redis)
            broker = self._in_namespace("broker", self.images["broker"])
            broker.with_envs(
                BROKER_PORT=str(s.broker_port),
                BROKER_STORAGE=s.broker_storage,
                S3_PORT=str(s.objectstore_port),
                S3_INTERNAL_PORT=str(s.objectstore_internal_port),
            )
            self._start("broker", broker)
            for role in ("postgres", "redis", "broker"):
                self._wait(role)
            registry = self._in_namespace("registry", self.images["registry"])
            registry.with_envs(
                REGISTRY_PORT=str(s.schema_registry_port),
                BOOTSTRAP_SERVERS=f"127.0.0.1:{s.broker_port}",
                REGISTRY_TOPIC=s.schema_registry_topic,
            )
            self._start("registry", registry)
            self._wait("registry")
        except BaseException:
            self.down()
            raise
        self.start_seconds = time.monotonic() - started

    def _start(self, role: str, container: "DockerContainer") -> None:
        self.containers[role] = container  # before start: down() removes a half-started one
        container.start()

    # -- the CDC part as a container ---------------------------------------------------------

    def start_cdc(
        self, name: str, env: dict[str, str], home: Path | None = None
    ) -> "DockerContainer":
        """Tributary's CDC part (Debezium's embedded engine) as a container of this stack, with
        the local stack's connector properties; ``env`` adds TRIBUTARY_* settings; ``home``: a
        host folder mounted as its state folder (offsets, status), else its own."""
        if "cdc" not in self.images:
            from infra.containers.images import build_images

            self.images["cdc"] = build_images(["cdc"])["cdc"].ref
        s = self.settings
        container = self._in_namespace(name, self.images["cdc"])
        defaults = {
            "TRIBUTARY_POSTGRES_URL": s.database_url,
            "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{s.broker_port}",
            "TRIBUTARY_SCHEMA_REGISTRY_URL": f"http://127.0.0.1:{s.schema_registry_port}",
            "TRIBUTARY_CDC_CONNECTOR_NAME": name,
            "TRIBUTARY_CDC_METRICS_PORT": "0",  # none: the network namespace is the stack's
        }
        container.with_envs(**{**defaults, **env})
        if home is not None:
            home.mkdir(parents=True, exist_ok=True)
            container.with_volume_mapping(str(home), "/var/lib/tributary", "rw")
        self._start(name, container)
        return container

    def remove(self, role: str) -> None:
        """Remove one container of this stack (force), by id."""
        container = self.containers.pop(role, None)
        if container is not None:
            with contextlib.suppress(Exception):
                container.stop(force=True, delete_volume=True)

    # -- readiness ---------------------------------------------------------------------------

    def ready(self, role: str) -> bool:
        """True once the service answers a real request on its published port."""
        probes: dict[str, Callable[[], bool]] = {
            "postgres": self._postgres_ready,
            "redis": self._redis_ready,
            "broker": self._broker_ready,
            "registry": self._registry_ready,
        }
        return probes[role]()

    def _wait(self, role: str) -> None:
        container = self.containers[role]
        deadline = time.monotonic() + self.settings.start_timeout_s
        while time.monotonic() < deadline:
            if self.ready(role):
                return
            container.reload()
            if container.status in ("exited", "dead"):
                break
            time.sleep(0.1)
        out, err = container.get_logs()
        tail = (out + err).decode(errors="replace")[-3000:]
        raise StartTimeoutError(f"container {role} ({container.image}) did not answer:\n{tail}")

    def _postgres_ready(self) -> bool:
        import psycopg

        s = self.settings
        try:
            with psycopg.connect(
                f"host=127.0.0.1 port={s.postgres_port} user=postgres dbname=tributary",
                connect_timeout=2,
            ) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def _redis_ready(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.settings.redis_port, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def _broker_ready(self) -> bool:
        from infra.stack.broker import BrokerService
        from infra.stack.objectstore import ObjectStoreService

        s = self.settings
        store = ObjectStoreService(Path("/nonexistent"), s.objectstore_port, 0)
        return BrokerService(Path("/nonexistent"), s.broker_port, store).ready()

    def _registry_ready(self) -> bool:
        from infra.stack.registry import SchemaRegistryService

        s = self.settings
        return SchemaRegistryService(Path("/nonexistent"), s.schema_registry_port, "", "").ready()

    # -- the end -----------------------------------------------------------------------------

    def container_ids(self) -> list[str]:
        ids = []
        for container in self.containers.values():
            with contextlib.suppress(Exception):
                ids.append(container.get_container_id())
        return ids

    def down(self, graceful: bool = False) -> None:
        """Remove every container of this stack by id (the holder of the namespace last), then
        any other container carrying this stack's label. ``graceful``: stop the broker and
        PostgreSQL with their stop signals first (the data is kept until removal anyway)."""
        roles = [r for r in self.containers if r != "net"]
        roles += ["net"] if "net" in self.containers else []
        for role in roles:
            container = self.containers[role]
            if graceful and role in ("broker", "postgres"):
                with contextlib.suppress(Exception):
                    container.get_wrapped_container().stop(timeout=30)
            with contextlib.suppress(Exception):
                container.stop(force=True, delete_volume=True)
        self.containers.clear()
        remove_labelled({STACK_LABEL: self.stack_id})


def _labelled(client: "DockerClient", labels: dict[str, str]) -> Iterator[Any]:
    filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
    yield from client.containers.list(all=True, filters=filters)


def _holders_last(containers: list[Any]) -> list[Any]:
    """The namespace holders after the containers that joined their namespace: an engine
    refuses to remove a holder while a container that joined it exists."""
    return sorted(containers, key=lambda c: (c.labels or {}).get(ROLE_LABEL) == "net")


def remove_labelled(labels: dict[str, str]) -> list[str]:
    """Remove (force) every container with these labels, holders last; returns their ids."""
    client = docker_client()
    removed = []
    for container in _holders_last(list(_labelled(client, labels))):
        with contextlib.suppress(Exception):
            container.remove(force=True, v=True)
            removed.append(container.id)
    return removed


def reap_orphans() -> list[str]:
    """Remove containers of stacks whose owner process on this host no longer runs (holders
    last)."""
    client = docker_client()
    host = socket.gethostname()
    orphans = []
    for container in client.containers.list(all=True, filters={"label": [STACK_LABEL]}):
        owner = (container.labels or {}).get(OWNER_LABEL, "")
        owner_host, _, pid = owner.rpartition(":")
        if owner_host != host or not pid.isdigit() or pid_exists(int(pid)):
            continue
        orphans.append(container)
    removed = []
    for container in _holders_last(orphans):
        with contextlib.suppress(Exception):
            container.remove(force=True, v=True)
            removed.append(container.id)
    return removed
