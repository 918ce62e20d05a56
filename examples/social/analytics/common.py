"""What every social analytics job shares: its configuration, its stores (PostgreSQL tables
services read, and Kafka topics ``analytics.<job>`` for downstream teams), reading from
PostgreSQL for queries, and the count of late records."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from connectors.errors import StoreUnavailableError
from connectors.kafka import KafkaConfig
from connectors.stores.kafka import KafkaStore
from connectors.stores.pg_tables import TypedColumn, TypedTable
from connectors.stores.postgres import PostgresStore
from examples.social.analytics.stateful import FORGOTTEN
from projections.time import LATE, Lateness
from tributary.view_model import Applied, Put
from tributary.view_store import Collection, Materializer, StoreTxn, ViewStore

Layout = Collection | TypedTable


@dataclass(frozen=True)
class AnalyticsConfig:
    """Where the jobs read and write, and the lateness rule they apply.

    ``prefix`` goes before every job name (tests run several copies side by side);
    ``topic_prefix`` before every output topic (``analytics.`` -> ``analytics.trending``).
    """

    kafka: KafkaConfig
    dsn: str
    schema: str
    activity_topic: str = "activity"
    posts_topic: str = "events.post"
    follows_topic: str = "events.follows"
    users_topic: str = "cdc.public.users"
    subjects_topic: str = "events.subject"  # SubjectForgotten: the jobs purge the user
    lateness: Lateness = field(default_factory=Lateness)
    query_dsn: str | None = None
    prefix: str = ""
    topic_prefix: str = "analytics."
    kafka_output: bool = True
    # the schema registry the events' schema ids refer to
    registry_url: str = "http://127.0.0.1:18081"
    # (DSN, event store schema) of the subject keys: whom `tributary verify` knows forgotten
    keys: tuple[str, str] | None = None

    @property
    def reader_dsn(self) -> str:
        return self.query_dsn or self.dsn

    def name(self, job: str) -> str:
        return f"{self.prefix}{job}"

    def kinds(self) -> dict[str, str]:
        """Topic -> what the decoder makes of it."""
        return {
            self.activity_topic: "activity",
            self.posts_topic: "events",
            self.follows_topic: "events",
            self.subjects_topic: "events",
            self.users_topic: "users",
        }


def typed(collection: str, table: str, key: Sequence[str], *columns: TypedColumn) -> TypedTable:
    return TypedTable(collection, table, tuple(columns), tuple(key))


def forgetting(holders: Mapping[str, Sequence[str]]) -> Materializer:
    """A job's materializer purging forgotten users from its outputs, in the atomic unit of the
    batch that carries their ``SubjectForgotten`` (a Put of the ``forgotten`` collection):
    every entry of ``holders`` (collection -> fields holding a user id) naming such a user is
    deleted; and any entry this batch writes that names a user forgotten before (a stateful
    operator's later output, a replay from offset zero) is deleted at once. One read of the
    forgotten users per batch."""

    def materialize(txn: StoreTxn, applied: Sequence[Applied]) -> None:
        now = {
            int(a.write.key)
            for a in applied
            if isinstance(a.write, Put) and a.write.collection == FORGOTTEN
        }
        for user in sorted(now):
            for collection, fields in holders.items():
                for name in fields:
                    for entry in txn.find(collection, name, user):
                        txn.delete(collection, entry.key)
        written = [
            a.write for a in applied if isinstance(a.write, Put) and a.write.collection in holders
        ]
        if not written:
            return
        forgotten = now | {int(e.key) for e in txn.find(FORGOTTEN, "subject_type", "user")}
        for write in written:
            if any(write.fields.get(name) in forgotten for name in holders[write.collection]):
                txn.delete(write.collection, write.key)

    return materialize


def forgotten_held(
    config: AnalyticsConfig, store: ViewStore, holders: Mapping[str, Sequence[str]]
) -> list[str]:
    """What the job's store still holds of forgotten users (those the subject keys say are
    forgotten, and those the job was told of): `tributary verify` reports each."""
    users = {int(e.key) for e in store.scan(FORGOTTEN)}
    if config.keys is not None:
        dsn, schema = config.keys
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            try:
                keys = conn.execute(
                    sql.SQL(
                        "SELECT subject_id FROM {} WHERE subject_type = 'user' AND key IS NULL"
                    ).format(sql.Identifier(schema, "subject_keys"))
                ).fetchall()
            except psycopg.errors.UndefinedTable:  # no event store (yet): nobody forgotten
                keys = []
        users |= {int(r[0]) for r in keys if str(r[0]).isdecimal()}
    if not users:
        return []
    return [
        f"{store.view} still holds forgotten user {user}: {collection} {entry.key}"
        for collection, fields in holders.items()
        for entry in store.scan(collection)
        for user in sorted(users & {entry.fields.get(name) for name in fields})
    ]


def stores(
    config: AnalyticsConfig,
    job: str,
    layouts: Sequence[Layout],
    main: str,
    materializer: Materializer | None = None,
    lookups: dict[str, tuple[str, ...]] | None = None,
    holders: Mapping[str, Sequence[str]] | None = None,
) -> tuple[ViewStore, tuple[ViewStore, ...]]:
    """The job's PostgreSQL store (with its ``late`` collection) and, unless turned off, a
    Kafka store writing the collection ``main`` to ``analytics.<job>`` and the others to
    ``analytics.<job>.<collection>`` (``lookups``: fields the materializer finds entries by,
    for the Kafka store; PostgreSQL finds by any column). ``holders`` (collection -> fields
    holding a user id): the job reads ``events.subject`` and purges forgotten users
    (:func:`forgetting`; the ``forgotten`` collection added, its own materializer unless one
    is given)."""
    name = config.name(job)
    every = [*layouts, Collection(LATE)]
    if holders:
        assert materializer is None, "a job's purge of forgotten users is its materializer"
        materializer = forgetting(holders)
        every.append(Collection(FORGOTTEN, ("subject_type",)))
        lookups = {**(lookups or {}), **{c: tuple(f) for c, f in holders.items()}}
    primary = PostgresStore(config.dsn, config.schema, name, every, materializer)
    if not config.kafka_output:
        return primary, ()
    collections = [
        Collection(
            layout.collection if isinstance(layout, TypedTable) else layout.name,
            (lookups or {}).get(
                layout.collection if isinstance(layout, TypedTable) else layout.name,
                () if isinstance(layout, TypedTable) else layout.lookups,
            ),
        )
        for layout in every
    ]
    topic = f"{config.topic_prefix}{job}"
    topics = {
        c.name: topic if c.name == main else f"{topic}.{c.name.replace('_', '-')}"
        for c in collections
    }
    kafka = KafkaStore(config.kafka, name, collections, materializer, topics=topics)
    return primary, (kafka,)


def read_rows(
    config: AnalyticsConfig, statement: sql.Composed, params: Sequence[Any] = ()
) -> list[dict[str, Any]]:
    """Rows of a query on the views schema (none when the job has not written the table yet);
    :class:`StoreUnavailableError` when PostgreSQL cannot be reached."""
    try:
        with psycopg.connect(config.reader_dsn, connect_timeout=5) as conn:
            cursor = conn.execute(statement, params)
            names = [d.name for d in cursor.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    except psycopg.errors.UndefinedTable:
        return []
    except psycopg.OperationalError as exc:
        raise StoreUnavailableError(f"analytics store unreachable: {exc}") from exc


def table(config: AnalyticsConfig, name: str) -> sql.Identifier:
    return sql.Identifier(config.schema, name)


def late_counter(config: AnalyticsConfig, store: ViewStore) -> Callable[[], dict[str, int]]:
    """The job's metrics: how many records it found beyond the allowed lateness (exact: one
    entry per record in its ``late`` collection)."""

    def metrics() -> dict[str, int]:
        assert isinstance(store, PostgresStore)
        rows = read_rows(
            config,
            sql.SQL("SELECT count(*) AS n FROM {}").format(table(config, store.table(LATE, None))),
        )
        return {"late_events": int(rows[0]["n"]) if rows else 0}

    return metrics
