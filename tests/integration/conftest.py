"""The integration session: one real stack for all tests, or the services named in the env.

Set ``TRIBUTARY_TEST_KAFKA_BOOTSTRAP_SERVERS`` and ``TRIBUTARY_TEST_POSTGRES_URL`` (and Kafka's
security settings as ``TRIBUTARY_TEST_KAFKA_*``; optionally ``TRIBUTARY_TEST_REDIS_URL`` and
``TRIBUTARY_TEST_SCHEMA_REGISTRY_URL``) to run the same tests against an existing Kafka and
PostgreSQL: the session then works in a database and on topics of its own there and removes
them at the end (``tests/integration/brought.py``; ``make test-byo``). Otherwise the session
starts a local stack in a temporary folder on free ports and tears it down. Tests that must
own a service to stop or kill it (a broker restart) start their own in either case.

The session's broker keeps its log in memory (``broker_storage="memory"``): the same Tansu,
without the object store under it, which on S3 costs about 13 ms of CPU per produce request
and 0.12 s per second idle on this 2-core machine. The tests of what the S3 engine itself does
(its listing waits, its under-reported ends, topics that survive a broker restart) take
``s3_stack``: a broker on S3 storage of their module's own, as the local stack runs by default.

``TRIBUTARY_TEST_STACK=containers``: the same services as containers of the images in
``infra/containers`` (started with testcontainers through Docker or podman, ``make podman-setup``)
on the same kind of settings; the tests that need the local processes (``stack.local``) skip,
as with services named in the environment. The containers are removed by id after the
session, and those of an earlier session killed before its clean-up when the next one starts.
"""

import os
import shutil
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cdc.slots import drop_publication, drop_slot
from connectors.kafka import KafkaConfig, TopicAdmin
from connectors.postgres import PostgresConfig
from infra.settings import Settings
from infra.stack import LocalStack
from infra.stack.isolated import isolated_settings
from tests.integration.brought import BroughtSession, brought, report, unique_name

if TYPE_CHECKING:
    from infra.containers.stack import ContainerStack

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Endpoints:
    """Where the session's services are; ``local`` is set when the session started them."""

    settings: Settings
    local: LocalStack | None
    containers: "ContainerStack | None" = None  # TRIBUTARY_TEST_STACK=containers
    # Services named in the environment: the session's tag (in its names) and the services
    # it runs itself beside them (Redis, the schema registry, unless named too).
    tag: str | None = None
    own: LocalStack | None = None

    @property
    def brought(self) -> bool:
        """The session runs on a Kafka and PostgreSQL named in the environment."""
        return self.tag is not None

    @property
    def spark_kafka_options(self) -> dict[str, str]:
        """The Kafka source's options that reach the session's Kafka (``kafka.*``: its
        bootstrap servers and security properties)."""
        extra = {f"kafka.{k}": v for k, v in self.kafka.extra.items()}
        return {"kafka.bootstrap.servers": self.bootstrap_servers, **extra}

    @property
    def kafka_settings(self) -> dict[str, str]:
        """Kafka's settings (bootstrap servers, security), as fields, for a test's own
        settings (``load_settings(**stack.kafka_settings, ...)``)."""
        security = {
            name.removeprefix("TRIBUTARY_").lower(): value
            for name, value in self.settings.kafka_security_env().items()
        }
        return {"kafka_bootstrap_servers": self.bootstrap_servers, **security}

    @property
    def kafka(self) -> KafkaConfig:
        return self.settings.kafka("tributary-test")

    @property
    def bootstrap_servers(self) -> str:
        return self.settings.bootstrap_servers

    @property
    def database_url(self) -> str:
        return self.settings.database_url

    @property
    def postgres_dsn(self) -> str:
        """libpq form of the database URL (for psycopg)."""
        return self.settings.database_url.replace("postgresql+psycopg://", "postgresql://")

    @property
    def redis_url(self) -> str:
        return self.settings.cache_url


# The subset CI would run in containers mode too (`make test-containers`, marker
# `containers_subset`): one module per service as a container, no Spark, a few minutes in all.
CONTAINERS_SUBSET = (
    "tests/integration/containers/",  # the mode's own: a killed container, nothing left behind
    "tests/integration/cdc/test_capture.py",  # Debezium on PostgreSQL and the broker
    "tests/integration/schema_registry/test_confluent_clients.py",  # the registry, Confluent's
    "tests/integration/event_store/test_events_on_kafka.py",  # outbox -> CDC -> Avro, registry
    "tests/integration/stores/test_contract.py",  # the PostgreSQL, Redis and Kafka stores
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Which worker of `make test` runs what: tests/scheduling.py.
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
        if item.nodeid.startswith(CONTAINERS_SUBSET):
            item.add_marker(pytest.mark.containers_subset)


@pytest.fixture(scope="session")
def stack() -> Iterator[Endpoints]:
    try:
        values = brought(os.environ)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if values is not None:
        yield from _brought_stack(values)
        return
    if os.environ.get("TRIBUTARY_TEST_STACK", "processes") == "containers":
        yield from _container_stack()
        return
    settings = isolated_settings("tributary-session-", broker_storage="memory")
    local = LocalStack(settings)
    local.up()
    try:
        yield Endpoints(settings, local)
    finally:
        local.down(purge=True)
        shutil.rmtree(settings.home.parent, ignore_errors=True)


def _brought_stack(values: dict[str, str]) -> Iterator[Endpoints]:
    """The session on a Kafka and PostgreSQL named in the environment (see brought.py)."""
    session = BroughtSession(values)
    settings = isolated_settings(
        f"tributary-byo-{session.tag}-", broker_storage="memory", **session.settings_overrides()
    )
    admin = TopicAdmin(settings.kafka("tributary-test-session"))
    session.begin(set(admin.topic_names()))
    own = LocalStack(settings)
    wanted = [
        n
        for n, url in (("redis", "redis_url"), ("schema-registry", "schema_registry_url"))
        if url not in values
    ]
    try:
        own.up(wanted)
        report(
            f"session {session.tag}: database {session.database} on the brought PostgreSQL,"
            f" Kafka {settings.bootstrap_servers}"
            f" ({settings.kafka_security_protocol or 'PLAINTEXT'}); started here: {wanted}"
        )
        yield Endpoints(settings, None, tag=session.tag, own=own)
    finally:
        own.down(purge=True)
        slots = session.drop_database()
        others = session.other_sessions()
        doomed = session.topics_to_delete(set(admin.topic_names()), others)
        for start in range(0, len(doomed), 100):
            admin.delete(*doomed[start : start + 100])
        left = sorted(set(admin.topic_names()) - session.topics_before - set(doomed))
        report(
            f"session {session.tag} cleaned up: database {session.database} and its"
            f" {len(slots)} slot(s) dropped, {len(doomed)} topic(s) deleted"
            + (f"; other sessions running: {others}" if others else "")
            + (f"; new topics left: {left}" if left else "")
        )
        shutil.rmtree(settings.home.parent, ignore_errors=True)


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _container_stack() -> Iterator[Endpoints]:
    from infra.containers.stack import ContainerStack

    settings = isolated_settings("tributary-session-", broker_storage="memory")
    containers = ContainerStack(settings)
    # SIGTERM (a CI timeout) ends the session as Ctrl-C does: the fixtures' clean-up runs.
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_DFL and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupted)
    try:
        containers.up()
        print(
            f"\ncontainers stack {containers.stack_id} up in {containers.start_seconds:.1f}s"
            f" (images checked in {containers.images_seconds:.1f}s)"
        )
        yield Endpoints(settings, None, containers)
    finally:
        containers.down()
        if previous == signal.SIG_DFL and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(settings.home.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def s3_stack(stack: Endpoints) -> Iterator[Endpoints]:
    """The session's services, but a broker of the module's own on S3 storage (SeaweedFS, as
    the local stack runs by default), stopped after the module: its tests restart it, or
    check what Tansu's S3 engine does. With services named in the environment, the same
    broker of its own beside the brought PostgreSQL."""
    if stack.local is None and not stack.brought:
        yield stack  # containers
        return
    session = stack.settings
    settings = isolated_settings(
        "tributary-s3-",
        broker_storage="s3",
        postgres_port=session.postgres_port,
        redis_port=session.redis_port,
        schema_registry_port=session.schema_registry_port,
        postgres_url=session.postgres_url,
        redis_url=session.redis_url,
        schema_registry_url=session.schema_registry_url,
    )
    local = LocalStack(settings)
    local.up(["broker"])  # and its object store
    try:
        yield Endpoints(settings, local)
    finally:
        local.down(purge=True)
        shutil.rmtree(settings.home.parent, ignore_errors=True)


@pytest.fixture
def unique(stack: Endpoints) -> str:
    """A short unique suffix for topic, table and slot names (the session's tag first, on
    services named in the environment)."""
    return unique_name(stack.tag)


@pytest.fixture
def connector_factory(stack: Endpoints, tmp_path: Path, unique: str) -> Iterator[object]:
    """Makes real connectors (`tributary run cdc` processes); stops them and drops their
    slots and publications after the test."""
    from tests.integration.cdc_process import CdcProcess

    made: list[CdcProcess] = []

    def make(tables: list[str], **extra: str) -> CdcProcess:
        proc = CdcProcess(
            stack, tmp_path / f"cdc-{len(made)}", f"t{unique}_{len(made)}", tables, **extra
        )
        made.append(proc)
        return proc

    yield make
    db = PostgresConfig(stack.database_url)
    for proc in made:
        proc.stop()
        drop_slot(db, f"tributary_{proc.name}")
        drop_publication(db, f"tributary_{proc.name}")
