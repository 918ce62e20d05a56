"""Exclusive leases: a part that must run once (the CDC connector, each view job) holds a
lease on its name while it runs, so a second copy refuses to start and says who holds it.
(Command processors share the partitions of ``commands`` instead:
:mod:`connectors.partition_owners`.)

A lease is a PostgreSQL session advisory lock held on a connection of its own: the database
releases it the moment the holder's process dies, however it dies (``kill -9`` included), so
a crashed part never blocks its restart. Who holds each lease is written in
``tributary.leases`` for the refusal message and for ``status``.
"""

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from connectors.errors import ConnectorError

SCHEMA = "tributary"
KEY = "('x' || substr(md5(%s), 1, 15))::bit(60)::bigint"  # positive: pg_locks shows it whole
_SCHEMA_LOCK = 0x7472_6C65  # advisory lock around the one-time creation of the leases table


def create_once(
    conn: psycopg.Connection[Any], present: str, lock: int, statements: Sequence[str]
) -> None:
    """Run ``statements`` (idempotent DDL) unless ``present`` (a query returning NULL while the
    objects are missing) says they exist, under the advisory lock ``lock``: however many parts
    start at the same moment, two ``CREATE ... IF NOT EXISTS`` never race each other (they
    would fail on the catalog's unique index)."""
    row = conn.execute(present).fetchone()
    if row is not None and row[0] is not None:
        return
    conn.execute("SELECT pg_advisory_lock(%s)", (lock,))
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (lock,))


def ensure_schema(conn: psycopg.Connection[Any], schema: str = SCHEMA) -> None:
    """Create the leases table once. ``tributary run`` calls it before it starts the parts;
    every lease calls it too."""
    create_once(
        conn,
        f"SELECT to_regclass('{schema}.leases')",
        _SCHEMA_LOCK,
        [
            f"CREATE SCHEMA IF NOT EXISTS {schema}",
            f"CREATE TABLE IF NOT EXISTS {schema}.leases (name text PRIMARY KEY, pid integer,"
            " host text, command text, since timestamptz NOT NULL DEFAULT now())",
        ],
    )


def prepare(dsn: str) -> None:
    """Create the leases' table (once, before the parts that take leases start)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        ensure_schema(conn)


class LeaseHeldError(ConnectorError):
    """Another process holds the lease (the message names it)."""


class LeaseLostError(ConnectorError):
    """The lease was lost (the database restarted) and another process took it."""


class Lease:
    """The lease on ``name``; :meth:`acquire` takes it or raises :class:`LeaseHeldError`."""

    def __init__(self, dsn: str, name: str) -> None:
        self.dsn = dsn
        self.name = name
        self._conn: psycopg.Connection[Any] | None = None
        self._waiting: psycopg.Connection[Any] | None = None  # a standby's, between tries
        self._keeper: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def held(self) -> bool:
        return self._conn is not None and not self._conn.closed

    def _take(self) -> bool:
        # A standby asks again and again: it keeps its connection between tries.
        conn = self._waiting
        if conn is None or conn.closed:
            conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
        self._waiting = None
        try:
            row = conn.execute(f"SELECT pg_try_advisory_lock({KEY})", (self.name,)).fetchone()
        except psycopg.Error:
            conn.close()
            raise
        if not (row and row[0]):
            self._waiting = conn
            return False
        ensure_schema(conn)
        conn.execute(
            f"INSERT INTO {SCHEMA}.leases (name, pid, host, command) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (name) DO UPDATE SET pid = EXCLUDED.pid, host = EXCLUDED.host,"
            " command = EXCLUDED.command, since = now()",
            (self.name, os.getpid(), socket.gethostname(), " ".join(sys.argv[:4])[:200]),
        )
        self._conn = conn
        return True

    def holder(self) -> str:
        """Who holds the lease, as recorded (best effort)."""
        try:
            with psycopg.connect(self.dsn, connect_timeout=10) as conn:
                row = conn.execute(
                    f"SELECT pid, host, command, since FROM {SCHEMA}.leases WHERE name = %s",
                    (self.name,),
                ).fetchone()
        except psycopg.Error:
            row = None
        if row is None:
            return "another process"
        return f"pid {row[0]} on {row[1]} ({row[2]}) since {row[3]:%Y-%m-%d %H:%M:%S}"

    def held_elsewhere(self) -> bool:
        """Whether another session holds the lease now (asked without trying to take it)."""
        conn = self._waiting
        if conn is None or conn.closed:
            conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
        self._waiting = conn
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks k WHERE k.locktype = 'advisory' AND k.granted"
            f" AND ((k.classid::bigint << 32) | k.objid::bigint) = {KEY}"
            " AND k.pid <> pg_backend_pid())",
            (self.name,),
        ).fetchone()
        return bool(row and row[0])

    def acquire(self, on_lost: Callable[[str], None] | None = None) -> "Lease":
        """Take the lease, and keep it: a keeper re-takes it after a database restart, and
        calls ``on_lost`` (with the reason) if another process took it meanwhile."""
        if not self.try_acquire(on_lost):
            raise LeaseHeldError(
                f"{self.name} is already running: {self.holder()}. Stop that one first"
                " (or wait: the lease is freed the moment its process ends)"
            )
        return self

    def try_acquire(self, on_lost: Callable[[str], None] | None = None) -> bool:
        """:meth:`acquire` without the error: False while another process holds the lease (a
        standby calls it in a loop; it keeps one connection for its tries)."""
        if not self._take():
            return False
        self._keeper = threading.Thread(
            target=self._keep, args=(on_lost,), name=f"lease-{self.name}", daemon=True
        )
        self._keeper.start()
        return True

    def _keep(self, on_lost: Callable[[str], None] | None) -> None:
        while not self._stop.wait(5.0):
            try:
                assert self._conn is not None
                self._conn.execute("SELECT 1")
                continue
            except Exception:
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
            while not self._stop.is_set():  # the database went away: take the lease again
                try:
                    if self._take():
                        break
                    if on_lost is not None:
                        on_lost(f"lost the lease on {self.name} to {self.holder()}")
                    return
                except psycopg.Error:
                    time.sleep(2.0)

    def release(self) -> None:
        self._stop.set()
        if self._waiting is not None:
            self._waiting.close()
            self._waiting = None
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.execute(f"SELECT pg_advisory_unlock({KEY})", (self.name,))
            self._conn.close()
            self._conn = None


def leases(dsn: str) -> list[dict[str, Any]]:
    """Every lease held now (for status)."""
    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn:
            rows = conn.execute(
                f"SELECT l.name, l.pid, l.host, l.since FROM {SCHEMA}.leases l"
                f" WHERE EXISTS (SELECT 1 FROM pg_locks k WHERE k.locktype = 'advisory'"
                f" AND k.granted AND ((k.classid::bigint << 32) | k.objid::bigint)"
                f" = {KEY.replace('%s', 'l.name')})"
            ).fetchall()
    except psycopg.Error:
        return []
    return [{"name": r[0], "pid": r[1], "host": r[2], "since": r[3].isoformat()} for r in rows]
