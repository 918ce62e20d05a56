"""Fixtures of the eventsourcing module's tests: a fresh event store schema per test, named in
the environment the library's way (``PERSISTENCE_MODULE``, ``POSTGRES_DSN``,
``POSTGRES_SCHEMA``), so the library's test cases, which build their applications and
factories from the environment, run against the module unmodified. The schema is dropped
after the test."""

import os
from collections.abc import Iterator

import psycopg
import pytest

from tests.integration.conftest import Endpoints
from tests.integration.spark_streaming.conftest import session_spark, spark  # noqa: F401

#: Settings of the library a developer's environment might hold; none may leak into a test.
LIBRARY_SETTINGS = (
    "PERSISTENCE_MODULE",
    "INFRASTRUCTURE_FACTORY",
    "FACTORY_TOPIC",
    "POSTGRES_DSN",
    "POSTGRES_DBNAME",
    "POSTGRES_HOST",
    "POSTGRES_PORT",
    "POSTGRES_USER",
    "POSTGRES_PASSWORD",
    "POSTGRES_SCHEMA",
    "POSTGRES_POOL_SIZE",
    "POSTGRES_MAX_OVERFLOW",
    "POSTGRES_LOCK_TIMEOUT",
    "ORIGINATOR_ID_TYPE",
    "CREATE_TABLE",
    "CIPHER_TOPIC",
    "CIPHER_KEY",
    "COMPRESSOR_TOPIC",
    "TRANSCODER_TOPIC",
    "IS_SNAPSHOTTING_ENABLED",
)


@pytest.fixture(autouse=True)
def eventsourcing_env(
    stack: Endpoints, unique: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The test's store schema, selected in ``os.environ``."""
    for name in LIBRARY_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    schema = f"es_lib_{unique}"
    monkeypatch.setenv("PERSISTENCE_MODULE", "event_store.eventsourcing")
    monkeypatch.setenv("POSTGRES_DSN", stack.postgres_dsn)
    monkeypatch.setenv("POSTGRES_SCHEMA", schema)
    # Small pools: the library's tests make many applications and never close some of them.
    monkeypatch.setenv("POSTGRES_POOL_SIZE", "2")
    yield schema
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def environment() -> dict[str, str]:
    """The module's settings as the fixture put them in ``os.environ``."""
    return {k: os.environ[k] for k in LIBRARY_SETTINGS if k in os.environ}
