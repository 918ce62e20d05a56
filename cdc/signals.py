"""Debezium's signal table: ask a running connector for an incremental snapshot."""

import json
import uuid

import psycopg
from psycopg import sql

from connectors.debezium import HEARTBEAT_TABLE, SIGNAL_SCHEMA, SIGNAL_TABLE
from connectors.postgres import PostgresConfig


def ensure_signal_table(db: PostgresConfig) -> None:
    """Create the signal table Debezium watches and the heartbeat table (idempotent)."""
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(SIGNAL_SCHEMA))
        )
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.{} "
                "(id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))"
            ).format(sql.Identifier(SIGNAL_SCHEMA), sql.Identifier(SIGNAL_TABLE))
        )
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.{} "
                "(connector text PRIMARY KEY, beat_at timestamptz NOT NULL)"
            ).format(sql.Identifier(SIGNAL_SCHEMA), sql.Identifier(HEARTBEAT_TABLE))
        )


def request_incremental_snapshot(db: PostgresConfig, tables: list[str]) -> str:
    """Insert an ``execute-snapshot`` signal; the connector snapshots the tables in chunks
    while streaming goes on. Returns the signal id."""
    signal_id = str(uuid.uuid4())
    data = json.dumps({"data-collections": tables, "type": "incremental"})
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.{} (id, type, data) VALUES (%s, 'execute-snapshot', %s)"
            ).format(sql.Identifier(SIGNAL_SCHEMA), sql.Identifier(SIGNAL_TABLE)),
            (signal_id, data),
        )
    return signal_id
