"""A small domain of views for the API tests: notes in PostgreSQL and counters in Redis, each
with queries, filled by applying batches to the real stores directly (no Spark).

``views`` is a view factory (``TRIBUTARY_VIEWS=tests.integration.api.library:views``) and
``command_registry`` a command-handlers factory (``TRIBUTARY_COMMAND_HANDLERS``) for the tests
that run the CLI in a child process.
"""

import os
import time
from collections.abc import Sequence
from typing import Any

from connectors.stores.postgres import PostgresStore
from connectors.stores.redis import RedisStore
from event_store import CommandRegistry
from examples.social import social_registry, users_table
from projections.view import Query, QueryParam, View
from tributary.view_model import Batch, Put, Write
from tributary.view_store import Collection, ViewStore
from views.catalog import ViewsConfig

NOTES = "notes"
COUNTERS = "counters"
USERS_SCHEMA_ENV = "TRIBUTARY_TEST_API_USERS_SCHEMA"


def _unused_fold(records: Any) -> Any:
    return records


def note(store: ViewStore, note_id: int) -> dict[str, Any]:
    entry = store.get(NOTES, str(note_id))
    if entry is None:
        raise LookupError(f"no note {note_id}")
    return {"id": note_id, **entry.fields}


def notes_tagged(store: ViewStore, tag: str, limit: int) -> list[dict[str, Any]]:
    if not tag.strip() or " " in tag:
        raise ValueError(f"tag must be one word, got {tag!r}")
    found = [e for e in store.scan(NOTES) if tag in e.fields.get("tags", [])]
    found.sort(key=lambda e: -int(e.key))
    return [{"id": int(e.key), **e.fields} for e in found[:limit]]


def counter(store: ViewStore, name: str) -> dict[str, Any]:
    entry = store.get(COUNTERS, name)
    if entry is None:
        raise LookupError(f"no counter {name!r}")
    return {"name": name, "value": entry.fields["value"]}


def notes_view(postgres_dsn: str, schema: str) -> View:
    store = PostgresStore(postgres_dsn, schema, NOTES, [Collection(NOTES)])
    return View(
        name=NOTES,
        topics=("test.notes",),
        fold=_unused_fold,
        store=store,
        queries=(
            Query(
                "note",
                "/notes/{note_id}",
                (QueryParam("note_id", int, where="path", required=True, minimum=1),),
                lambda note_id: note(store, note_id),
                "One note by its id.",
            ),
            Query(
                "notes",
                "/notes",
                (
                    QueryParam("tag", str, required=True, description="one word"),
                    QueryParam("limit", int, default=10, minimum=1, maximum=50),
                ),
                lambda tag, limit: notes_tagged(store, tag, limit),
                "Notes with a tag, newest first.\n\nThe tag is one word.",
            ),
        ),
    )


def counters_view(redis_url: str, name: str) -> View:
    store = RedisStore(redis_url, name, [Collection(COUNTERS)])
    return View(
        name=name,
        topics=("test.counters",),
        fold=_unused_fold,
        store=store,
        queries=(
            Query(
                "counter",
                "/counters/{name}",
                (QueryParam("name", str, where="path", required=True),),
                lambda name: counter(store, name),
                "A counter's value.",
            ),
        ),
    )


def build_views(postgres_dsn: str, schema: str, redis_url: str) -> list[View]:
    """The notes view in ``schema`` and a counters view named after it (unique per test)."""
    return [notes_view(postgres_dsn, schema), counters_view(redis_url, f"{COUNTERS}_{schema}")]


def views(config: ViewsConfig) -> list[View]:
    return build_views(config.postgres_dsn, config.views_schema, config.redis_url)


def command_registry() -> CommandRegistry:
    return social_registry(users_table(os.environ[USERS_SCHEMA_ENV]))


def apply(store: ViewStore, batch_id: int, writes: Sequence[Write]) -> None:
    """Apply one batch to the live generation, as a view job would."""
    writer = store.writer(store.live_generation(), live=True)
    try:
        assert writer.apply(Batch(batch_id, {store.view: {"0": batch_id + 1}}, writes))
    finally:
        writer.close()


def fill(views: Sequence[View]) -> None:
    """Batch 0 of each view: notes 1-3, counters visits and likes."""
    notes, counters = views
    apply(
        notes.store,
        0,
        [
            Put(NOTES, "1", 1, {"text": "first", "tags": ["a"]}),
            Put(NOTES, "2", 2, {"text": "second", "tags": ["a", "b"]}),
            Put(NOTES, "3", 3, {"text": "third", "tags": ["b"]}),
        ],
    )
    apply(counters.store, 0, [Put(COUNTERS, "visits", 1, {"value": 7})])


class ViewsLaggingError(Exception):
    """The stand-in's error: ``lagging`` names the views."""

    def __init__(self, token: str, lagging: tuple[str, ...]) -> None:
        super().__init__(f"views {', '.join(lagging)} did not apply {token} in time")
        self.lagging = lagging


class BatchWaiter:
    """A stand-in for ``ViewWaiter``: a token is ``<view>@<batch id>``; waiting polls the
    view's ledger until it reached that batch."""

    def __init__(self, views: Sequence[View]) -> None:
        self.stores = {v.name: v.store for v in views}
        self.tokens: list[str] = []

    def wait(self, token: str, timeout: float) -> None:
        self.tokens.append(token)
        view, _, batch = token.partition("@")
        if view not in self.stores or not batch.isdigit():
            raise ValueError(f"not a position token: {token!r}")
        store = self.stores[view]
        deadline = time.monotonic() + timeout
        while store.committed(store.live_generation()).batch_id < int(batch):
            if time.monotonic() >= deadline:
                raise ViewsLaggingError(token, (view,))
            time.sleep(0.05)
