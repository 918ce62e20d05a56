"""Where the library's records live in an event store schema, and the statements that make them.

Events go into the store's ``events`` table, which is the CDC outbox, so they reach Kafka as
Tributary's own do. What the library needs beyond Tributary's columns is in the row's
``metadata`` under the key ``eventsourcing`` (``_meta.metadata`` on Kafka carries it too)::

    {"eventsourcing": {"application": "BankAccounts", "notification_id": 7,
                       "topic": "eventsourcing.tests.domain:BankAccount.Opened"}}

plus ``"state"`` (base64) when the event's stored state is not a JSON object (the library's
cipher or compressor is on, or another transcoder): then ``data`` is ``{}`` and those bytes are
given back exactly. A JSON state is the row's ``data`` (so Spark views and consumers read its
fields) and comes back as jsonb prints it (same meaning; key order and spacing may differ).

A unique index on (application, notification id), partial to these rows, serves
``select_notifications`` and guards the sequence. The module's own tables: the notification
counter per application (``es_notification_counters``), tracking records (``es_tracking``)
and snapshots (``es_snapshots``; never published: a snapshot is a cache).
"""

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from event_store.schema import check_identifier, create_schema

#: SQL expressions over an ``events`` row written by this module.
OURS = "metadata ? 'eventsourcing'"
APPLICATION = "(metadata #>> '{eventsourcing,application}')"
NOTIFICATION_ID = "((metadata #>> '{eventsourcing,notification_id}')::bigint)"
TOPIC = "(metadata #>> '{eventsourcing,topic}')"
STATE = (
    "COALESCE(decode(metadata #>> '{eventsourcing,state}', 'base64'), "
    "convert_to(data::text, 'UTF8'))"
)

NOTIFICATION_INDEX = "events_eventsourcing_notification_idx"

_CREATE_LOCK = "tributary-eventsourcing:"

#: Gives a recorder's connection (autocommit) for the time of a ``with`` block.
Connect = Callable[[], AbstractContextManager[psycopg.Connection[Any]]]


def module_ddl(schema: str) -> list[str]:
    """The module's own tables (idempotent)."""
    s = check_identifier(schema)
    return [
        f"""CREATE TABLE IF NOT EXISTS {s}.es_notification_counters (
            application  text PRIMARY KEY,
            last_id      bigint NOT NULL
        )""",
        f"""CREATE TABLE IF NOT EXISTS {s}.es_tracking (
            application      text NOT NULL,
            upstream         text NOT NULL,
            notification_id  bigint NOT NULL,
            PRIMARY KEY (application, upstream)
        )""",
        f"""CREATE TABLE IF NOT EXISTS {s}.es_snapshots (
            application         text NOT NULL,
            purpose             text NOT NULL,
            originator_id       text NOT NULL,
            originator_version  bigint NOT NULL,
            topic               text NOT NULL,
            state               bytea NOT NULL,
            PRIMARY KEY (application, purpose, originator_id, originator_version)
        )""",
    ]


def notification_index_ddl(schema: str) -> str:
    s = check_identifier(schema)
    return (
        f"CREATE UNIQUE INDEX IF NOT EXISTS {NOTIFICATION_INDEX} "
        f"ON {s}.events ({APPLICATION}, {NOTIFICATION_ID}) WHERE {OURS}"
    )


def create_tables(connect: Connect, schema: str) -> None:
    """The event store schema (Tributary's ``create_schema``, when its ``events`` table is
    missing) and the module's tables and index. Idempotent; concurrent callers serialise.

    The index on ``events`` is created only when it is missing: ``CREATE INDEX`` locks the
    table against writes, which the start of an application must not do to a running store.
    """
    s = check_identifier(schema)
    with connect() as conn:
        found = conn.execute("SELECT to_regclass(%s)", (f"{s}.events",)).fetchone()
    if found is None or found[0] is None:
        _create_store_schema(connect, s)
    with connect() as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (_CREATE_LOCK + s,))
        for statement in module_ddl(s):
            conn.execute(statement)
        index = conn.execute("SELECT to_regclass(%s)", (f"{s}.{NOTIFICATION_INDEX}",)).fetchone()
        if index is None or index[0] is None:
            conn.execute(notification_index_ddl(s))


def _create_store_schema(connect: Connect, schema: str) -> None:
    """Tributary's ``create_schema`` (SQLAlchemy) on a connection to the same database."""
    with connect() as conn:
        info = conn.info
        target = make_conninfo(
            host=info.host,
            port=info.port,
            dbname=info.dbname,
            user=info.user,
            password=info.password,
        )

    def new_connection() -> psycopg.Connection[Any]:
        return psycopg.connect(target)

    engine = create_engine("postgresql+psycopg://", creator=new_connection, poolclass=NullPool)
    try:
        with engine.begin() as sa:
            create_schema(sa, schema)
    finally:
        engine.dispose()
