"""Per-test views (their own PostgreSQL schema and Redis names), the app over them, and the
event store of ``tests/integration/event_store`` for the commands."""

from collections.abc import Iterator

import psycopg
import pytest
import redis
from fastapi.testclient import TestClient

from infra.http_api import create_app
from infra.stack.isolated import free_port_block
from projections.view import View
from tests.integration.api.library import BatchWaiter, build_views, fill
from tests.integration.conftest import Endpoints
from tests.integration.event_store.conftest import StoreEnv, env  # noqa: F401  (fixture)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Schemathesis gives every operation's test the same node id (the operation is only in the
    item's name). pytest-xdist schedules by node id, so it would run one operation of the six
    and drop the rest: give each its own id, the name's."""
    for item in items:
        label = getattr(item, "operation_label", None)
        if label is not None and item.parent is not None and not item.nodeid.endswith("]"):
            item._id = item.parent.id.child(item.name)  # what pytest gives a plain item


@pytest.fixture
def views_schema(stack: Endpoints, unique: str) -> Iterator[str]:
    schema = f"api_{unique}"
    yield schema
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    client = redis.Redis.from_url(stack.redis_url)
    keys = list(client.scan_iter(match=f"tributary:*{schema}*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def api_views(stack: Endpoints, views_schema: str) -> list[View]:
    """The notes and counters views, holding batch 0."""
    views = build_views(stack.postgres_dsn, views_schema, stack.redis_url)
    fill(views)
    return views


@pytest.fixture
def waiter(api_views: list[View]) -> BatchWaiter:
    return BatchWaiter(api_views)


@pytest.fixture
def client(
    stack: Endpoints,
    api_views: list[View],
    env: StoreEnv,  # noqa: F811
    waiter: BatchWaiter,
) -> Iterator[TestClient]:
    app = create_app(stack.settings, views=api_views, bus=env.bus(), waiter=waiter)
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on."""
    return free_port_block(1)
