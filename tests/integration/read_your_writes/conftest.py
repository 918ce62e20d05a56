"""Fixtures of the read-your-writes tests: an event store per test (its schema, role and users
table), the real CDC connector, and a views schema per test."""

from collections.abc import Iterator

import psycopg
import pytest

from tests.integration.conftest import Endpoints
from tests.integration.event_store.conftest import env

__all__ = ["env", "views_schema"]


@pytest.fixture
def views_schema(stack: Endpoints, unique: str) -> Iterator[str]:
    schema = f"views_{unique}"
    yield schema
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]
