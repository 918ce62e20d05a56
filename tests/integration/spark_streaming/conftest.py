"""Fixtures of the Spark streaming tests: one SparkSession per test session, a source table
fed as Debezium would, and a views schema per test."""

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from spark_streaming.session import spark_session
from tests.integration.conftest import Endpoints
from tests.integration.spark_streaming.changefeed import ChangeFeed
from tests.jvm import SPARK_CLASS_ARCHIVE, SPARK_JAVA_OPTIONS
from tests.scheduling import starts_spark
from views.catalog import ViewsConfig


@pytest.fixture(scope="session")
def session_spark(stack: Endpoints) -> Iterator[Any]:
    scratch = tempfile.mkdtemp(prefix="tributary-spark-")
    session = spark_session(
        "local[2]",
        "tributary-tests",
        driver_memory="1g",
        local_dir=scratch,
        java_options=SPARK_JAVA_OPTIONS,
        class_archive=SPARK_CLASS_ARCHIVE,
    )
    yield session
    session.stop()
    shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def spark(request: pytest.FixtureRequest, session_spark: Any) -> Any:
    """The session's SparkSession, for a test `make test` runs in its Spark worker (a test
    outside ``tests/scheduling.py``'s list would run a second driver beside that worker's)."""
    if not starts_spark(request.node.nodeid):
        pytest.fail(f"{request.node.nodeid} starts Spark: add it to tests/scheduling.py")
    return session_spark


@pytest.fixture
def views_schema(stack: Endpoints, unique: str) -> Iterator[str]:
    schema = f"views_{unique}"
    yield schema
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def feed(stack: Endpoints, unique: str) -> Iterator[ChangeFeed]:
    change_feed = ChangeFeed(stack.postgres_dsn, stack.kafka, "public", f"src_{unique}")
    yield change_feed
    change_feed.close()


@pytest.fixture
def views_config(
    stack: Endpoints, feed: ChangeFeed, views_schema: str, tmp_path: Path
) -> ViewsConfig:
    return ViewsConfig(
        kafka=stack.kafka,
        postgres_dsn=stack.postgres_dsn,
        views_schema=views_schema,
        checkpoint_root=tmp_path / "checkpoints",
        mirror_tables=(feed.qualified,),
        max_offsets_per_trigger=1000,
    )
