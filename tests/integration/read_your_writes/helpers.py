"""Views advanced by hand (no Spark), rows of published_streams, and the command handlers the
CLI and the client load by name in these tests."""

import os
from collections.abc import Sequence
from typing import Any

import psycopg

from connectors.stores.postgres import PostgresStore
from event_store import CommandRegistry
from examples.social import social_registry, users_table
from projections.view import View
from tributary.view_model import Batch
from tributary.view_store import Collection
from views.catalog import ViewsConfig

USERS_SCHEMA_ENV = "RYW_TEST_USERS_SCHEMA"
TIMELINE = "ryw.timeline"


def registry() -> CommandRegistry:
    """The social handlers over the test's users table (named in the environment)."""
    return social_registry(users_table(os.environ[USERS_SCHEMA_ENV]))


def timeline_views(config: ViewsConfig) -> Sequence[View]:
    """A view factory (TRIBUTARY_VIEWS): one view reading events.post that no job runs."""
    return [hand_view(config.postgres_dsn, config.views_schema, TIMELINE, ("events.post",))]


def _identity(records: Any) -> Any:
    return records


def hand_view(dsn: str, schema: str, name: str, topics: tuple[str, ...]) -> View:
    """A view whose PostgreSQL store the test advances with :func:`advance`."""
    store = PostgresStore(dsn, schema, name, [Collection("items")])
    return View(name, topics, fold=_identity, store=store)


def advance(view: View, offsets: dict[str, dict[str, int]], batch_id: int) -> None:
    """Apply an empty batch reaching ``offsets`` (next offset per topic and partition) to the
    view's live generation, as its job would."""
    store = view.store
    writer = store.writer(store.live_generation(), live=True)
    try:
        writer.apply(Batch(batch_id, offsets))
    finally:
        writer.close()


def publish(
    dsn: str, schema: str, stream_id: str, version: int, offset: int, partition: int = 0
) -> None:
    """Write the row CDC would write after publishing ``stream_id`` at ``version``."""
    statement = (
        f"INSERT INTO {schema}.published_streams (stream_id, stream_type, version, topic,"
        " partition, \"offset\") VALUES (%s, 'post', %s, 'events.post', %s, %s)"
        " ON CONFLICT (stream_id) DO UPDATE SET version = EXCLUDED.version,"
        ' partition = EXCLUDED.partition, "offset" = EXCLUDED."offset"'
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement, (stream_id, version, partition, offset))  # type: ignore[arg-type]


def published_row(dsn: str, schema: str, stream_id: str) -> tuple[Any, ...] | None:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            f"""SELECT stream_type, version, topic, partition, "offset", published_at
                FROM {schema}.published_streams WHERE stream_id = %s""",  # type: ignore[arg-type]
            (stream_id,),
        ).fetchone()
