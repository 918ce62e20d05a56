"""Replication slots, publications and replica identity: what CDC owns in PostgreSQL."""

from dataclasses import dataclass

import psycopg
from psycopg import sql

from connectors.postgres import PostgresConfig


@dataclass(frozen=True)
class SlotInfo:
    """A logical replication slot, how much WAL it holds back, and against what budget.

    ``wal_status`` is PostgreSQL's: ``reserved``/``extended`` (fine), ``unreserved`` (past the
    budget, lost at the next checkpoint), ``lost`` (invalidated: its WAL is gone).
    ``budget_bytes`` is ``max_slot_wal_keep_size`` (None: unbounded).
    """

    name: str
    active: bool
    retained_wal_bytes: int | None
    confirmed_flush_lsn: str | None
    wal_status: str | None = None
    budget_bytes: int | None = None

    @property
    def invalidated(self) -> bool:
        return self.wal_status == "lost"

    def budget_used(self) -> float | None:
        """Share of the WAL budget the slot holds back (None: no budget, or unknown)."""
        if self.budget_bytes is None or self.retained_wal_bytes is None:
            return None
        return self.retained_wal_bytes / self.budget_bytes


def slot_info(db: PostgresConfig, slot: str) -> SlotInfo | None:
    with psycopg.connect(db.dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(
            """SELECT slot_name, active,
                      pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint,
                      confirmed_flush_lsn::text, wal_status,
                      (SELECT setting::bigint * 1024 * 1024 FROM pg_settings
                        WHERE name = 'max_slot_wal_keep_size' AND setting <> '-1')
               FROM pg_replication_slots WHERE slot_name = %s""",
            (slot,),
        ).fetchone()
    if row is None:
        return None
    return SlotInfo(row[0], bool(row[1]), row[2], row[3], row[4], row[5])


def drop_slot(db: PostgresConfig, slot: str) -> bool:
    """Drop a replication slot (terminating its walsender if one is still attached)."""
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(
            """SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
               WHERE slot_name = %s AND active_pid IS NOT NULL""",
            (slot,),
        )
        row = conn.execute(
            """SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
               WHERE slot_name = %s""",
            (slot,),
        ).fetchone()
    return row is not None


def drop_publication(db: PostgresConfig, publication: str) -> None:
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(publication)))


def set_replica_identity_full(db: PostgresConfig, tables: list[str]) -> None:
    """Make updates and deletes carry the whole old row (``before``) for these tables."""
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        for table in tables:
            schema, name = table.split(".", 1)
            conn.execute(
                sql.SQL("ALTER TABLE {}.{} REPLICA IDENTITY FULL").format(
                    sql.Identifier(schema), sql.Identifier(name)
                )
            )
