"""Start, stop and report the local stack as a whole."""

import shutil
import subprocess
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from infra.errors import InfraError, LowDiskSpaceError, MissingBinaryError, PortInUseError
from infra.stack.broker import BrokerService
from infra.stack.cache import RedisService
from infra.stack.objectstore import ObjectStoreService
from infra.stack.postgres import PostgresService
from infra.stack.process import port_is_free
from infra.stack.registry import NAME as REGISTRY
from infra.stack.registry import SchemaRegistryService, registry_answers
from infra.stack.service import Service
from infra.stack.spark import SparkMasterService, SparkWorkerService
from tributary.redact import redact_url

MIB = 1024 * 1024
# Free space the stack wants on top of what its services need to keep working: room for the
# services' first files, the views' checkpoints and a demo's data.
DISK_HEADROOM_BYTES = 768 * MIB

if TYPE_CHECKING:  # `tributary status` loads the light settings: pydantic is not imported
    from infra.settings import Settings


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    state: Literal["up", "down"]
    endpoint: str
    pid: int | None
    mode: Literal["processes", "containers"] = "processes"  # `tributary up [--containers]`

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class LocalStack:
    """The stack's services, in start order. Every operation is idempotent.

    ``spark_workers``: run a Spark standalone master with that many workers (0: none); the
    count is kept in the state folder, so later commands (``status``, ``down``, ``up``) run
    the same cluster. None: as the last ``up --spark-workers`` asked."""

    def __init__(self, settings: "Settings", spark_workers: int | None = None) -> None:
        self.settings = settings
        self.home = settings.home.resolve()
        self.postgres = PostgresService(
            self.home,
            settings.postgres_port,
            settings.postgres_bin_dir,
            settings.postgres_wal_budget_mb,
        )
        self.redis = RedisService(self.home, settings.redis_port, settings.redis_server_bin)
        self.objectstore = ObjectStoreService(
            self.home, settings.objectstore_port, settings.objectstore_internal_port
        )
        self.broker = BrokerService(
            self.home,
            settings.broker_port,
            self.objectstore,
            in_memory=settings.broker_storage == "memory",
        )
        # With TRIBUTARY_SCHEMA_REGISTRY_URL set, that registry is used and none is started.
        self.registry = (
            SchemaRegistryService(
                self.home,
                settings.schema_registry_port,
                settings.bootstrap_servers,
                settings.schema_registry_topic,
                settings.kafka_security_env(),
            )
            if settings.schema_registry_url is None
            else None
        )
        self.spark_master = SparkMasterService(
            self.home,
            settings.spark_master_port,
            settings.spark_master_ui_port,
            settings.spark_java_options,
        )
        self._spark_workers = spark_workers
        count = self.spark_master.recorded_workers() if spark_workers is None else spark_workers
        self.spark_workers = [
            SparkWorkerService(
                self.home,
                i,
                self.spark_master,
                settings.spark_worker_cores,
                settings.spark_worker_memory,
            )
            for i in range(count)
        ]

    @property
    def spark(self) -> list[Service]:
        """The Spark cluster's services (master first), if the stack runs one."""
        return [self.spark_master, *self.spark_workers] if self.spark_workers else []

    @property
    def services(self) -> list[Service]:
        """The processes the stack runs; the registry last (it needs the broker). A broker in
        memory needs no object store."""
        store = [] if self.broker.in_memory else [self.objectstore]
        own: list[Service] = [self.postgres, self.redis, *store, self.broker]
        registry = [] if self.registry is None else [self.registry]
        return [*own, *registry, *self.spark]

    def service(self, name: str) -> Service:
        for svc in self.services:
            if svc.name == name:
                return svc
        raise InfraError(f"no component {name!r}; choose from {[s.name for s in self.services]}")

    def status(self) -> list[ComponentStatus]:
        out = []
        for svc in self.services:
            pid = svc.pid()
            up = pid is not None and svc.ready()
            out.append(ComponentStatus(svc.name, "up" if up else "down", svc.endpoint(), pid))
        if self.registry is None and self.settings.schema_registry_url is not None:
            url = self.settings.schema_registry_url
            state: Literal["up", "down"] = "up" if registry_answers(url) else "down"
            out.append(ComponentStatus(REGISTRY, state, redact_url(url), None))
        return out

    def up(self, names: Iterable[str] | None = None) -> list[ComponentStatus]:
        """Start whatever is not running; check every port and binary before starting any."""
        if self._spark_workers is not None:
            self._resize_spark(self._spark_workers)
        wanted = self.services if names is None else [self.service(n) for n in names]
        if any(w in wanted for w in self.spark_workers) and self.spark_master not in wanted:
            wanted.insert(0, self.spark_master)
        external_kafka = self.settings.kafka_bootstrap_servers is not None
        if self.registry in wanted and self.broker not in wanted and not external_kafka:
            wanted.insert(wanted.index(self.registry), self.broker)
        if self.broker in wanted and not self.broker.in_memory and self.objectstore not in wanted:
            wanted.insert(wanted.index(self.broker), self.objectstore)
        todo = [svc for svc in wanted if svc.pid() is None]
        self._preflight(todo)
        self.home.mkdir(parents=True, exist_ok=True)
        started: list[Service] = []
        try:
            after_broker: list[Service] = [s for s in todo if s is self.registry]
            cluster = [s for s in todo if s in self.spark]
            first = [
                s
                for s in todo
                if s is not self.broker and s not in after_broker and s not in cluster
            ]
            procs = {svc.name: svc.start() for svc in first}
            started += first
            with ThreadPoolExecutor(max_workers=max(1, len(first))) as pool:
                waits = [
                    pool.submit(svc.wait_ready, procs[svc.name], self.settings.start_timeout_s)
                    for svc in first
                ]
                for fut in waits:
                    fut.result()
            if self.broker in todo:
                proc = self.broker.start()
                started.append(self.broker)
                self.broker.wait_ready(proc, self.settings.start_timeout_s)
            for late in after_broker:
                proc = late.start()
                started.append(late)
                late.wait_ready(proc, self.settings.start_timeout_s)
            if self.spark_master in cluster:  # the workers register with it
                proc = self.spark_master.start()
                started.append(self.spark_master)
                self.spark_master.wait_ready(proc, self.settings.start_timeout_s)
            workers = [s for s in cluster if s is not self.spark_master]
            procs = {svc.name: svc.start() for svc in workers}
            started += workers
            for svc in workers:
                svc.wait_ready(procs[svc.name], self.settings.start_timeout_s)
        except BaseException:
            for svc in reversed(started):
                svc.stop()
            raise
        return self.status()

    def _resize_spark(self, count: int) -> None:
        """Keep ``count`` workers: stop the ones beyond it (and the master, for 0)."""
        running = sorted(self.home.glob("run/spark-worker-*.pid"))
        for pidfile in running:
            index = int(pidfile.stem.rsplit("-", 1)[1])
            if index >= count:
                SparkWorkerService(
                    self.home, index, self.spark_master, 1, self.settings.spark_worker_memory
                ).stop()
        if count == 0:
            self.spark_master.stop()
        self.spark_master.record_workers(count)

    def _preflight(self, todo: list[Service]) -> None:
        for svc in todo:
            for binary in svc.binaries():
                found = Path(binary).exists() if "/" in str(binary) else shutil.which(str(binary))
                if not found:
                    raise MissingBinaryError(
                        f"{svc.name}: {binary} not found; run `make setup` to install it"
                    )
        self._check_free_space(todo)
        busy = [
            f"{port} ({setting}, for {svc.name})"
            for svc in todo
            for port, setting in svc.ports().items()
            if not port_is_free(port)
        ]
        if busy:
            raise PortInUseError(
                "ports already in use by another process: "
                + ", ".join(busy)
                + ". Stop that process or choose free ports with those settings; "
                "nothing was started."
            )

    def _check_free_space(self, todo: list[Service]) -> None:
        """Refuse to start a service that would soon stop working for want of disk space:
        SeaweedFS turns read-only near a full disk, and the broker then hangs on every write."""
        needed = max((svc.min_free_bytes for svc in todo), default=0)
        if not needed:
            return
        folder = self.home.absolute()
        while not folder.exists():
            folder = folder.parent
        free = shutil.disk_usage(folder).free
        if free < needed + DISK_HEADROOM_BYTES:
            names = ", ".join(svc.name for svc in todo if svc.min_free_bytes)
            raise LowDiskSpaceError(
                f"only {free // MIB} MiB free on the disk of {self.home}; {names} stops taking "
                f"writes below {needed // MIB} MiB (the broker then cannot create a topic or "
                f"append), and the stack wants {(needed + DISK_HEADROOM_BYTES) // MIB} MiB to "
                "start. Free space on that disk or put the state folder on another one "
                "(TRIBUTARY_HOME); nothing was started."
            )

    def down(self, purge: bool = False) -> None:
        """Stop every service gracefully (broker first, so it flushes to storage); with
        ``purge`` the data goes too, so a service that need not be stopped gently is not."""
        for svc in reversed(self.services):
            svc.stop(discard=purge)
        if purge and self.home.exists():
            shutil.rmtree(self.home)

    def restart(self, name: str) -> None:
        svc = self.service(name)
        svc.stop()
        proc: subprocess.Popen[bytes] = svc.start()
        svc.wait_ready(proc, self.settings.start_timeout_s)
