"""Partitions divided among the instances of one part, owned in PostgreSQL and fenced.

Several instances of a part that reads a topic (the command processors) divide its partitions
among themselves: each partition has exactly one owner at a time, and the partitions are
divided again when an instance joins, leaves or dies.

- **Members.** Each instance is a member of its group (``tributary.partition_members``): it
  holds a session advisory lock on its member id, on a connection of its own, and a heartbeat
  renews its row's ``expires_at`` every ``timeout / 4``. A member is alive while both hold. A
  ``kill -9`` frees the lock at once (the database closes the session), so its partitions are
  free at the others' next rebalance, with no time-to-live to wait out. A *paused* member (a
  stopped process, a frozen VM) keeps its connection, so its lock stays held; it dies when its
  row expires, ``timeout`` after its last heartbeat. A *hung* member (its loop stuck in a
  handler while the heartbeat thread runs on) stops renewing once its loop has not polled for
  ``max_poll_interval`` (Kafka's ``max.poll.interval.ms``), so it dies the same way, ``timeout``
  later; its heartbeat renews again after the loop's next poll.
- **Owners.** ``tributary.partition_owners`` holds one row per partition: owner, ``epoch``
  (bumped at every change of owner) and ``expires_at`` (renewed by the owner's heartbeat). A
  member takes a partition that is unowned, expired or owned by a dead member, up to its share
  (partitions / live members, the first members in id order take one more); a member over its
  share gives its highest partitions back. Shares are computed by each member from the same
  table, so they converge within a rebalance.
- **Fence.** Every write an owner makes for a partition runs, in its own transaction, the
  statement :meth:`Ownership.fence` returns: it locks the partition's row ``FOR SHARE`` and
  raises SQLSTATE ``TRF01`` (:data:`FENCED_SQLSTATE`) unless the row still names this owner at
  this epoch and has not expired (``clock_timestamp()``: the time of the check, not of the
  transaction's start). A take-over's ``UPDATE`` waits for that lock, so a write that passed the
  fence commits before the new owner starts; after the take-over, the old owner's writes fail
  and store nothing. Times are the database's, never the members' clocks.

Why not Kafka's group membership (cooperative-sticky)? Measured on the local broker (Tansu,
2 cores, ``bench/processors.py --groups``, session timeout 6 s, the least a broker allows by
default): the first member was assigned after 3.0 s, a joining member waited 11.1 s until
the partitions were divided, a leaving one's partitions moved in 4.0 s, and a ``kill -9``
would wait out the whole session timeout. Here: a second processor had its share 1.5-2.2 s
after it was started (its start-up included), a ``kill -9``-ed one's partitions were owned
again 0.34 s later. And a group would still need a fence in PostgreSQL, where the writes go.
"""

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from contextlib import suppress
from typing import Any

import psycopg

from connectors.errors import ConnectorError
from connectors.leases import KEY, create_once

log = logging.getLogger(__name__)

SCHEMA = "tributary"
FENCED_SQLSTATE = "TRF01"
_SCHEMA_LOCK = 0x7472_706F  # advisory lock around the one-time creation of the tables
_HELD = (
    "EXISTS (SELECT 1 FROM pg_locks k WHERE k.locktype = 'advisory' AND k.granted"
    " AND ((k.classid::bigint << 32) | k.objid::bigint) = {key})"
)
_ALIVE = f"m.expires_at > clock_timestamp() AND {_HELD.format(key='m.lock_key')}"


class PartitionFencedError(ConnectorError):
    """This instance no longer owns the partition (another took it over, or its lease
    expired while it was paused): nothing of the write was stored."""


def ensure_schema(conn: psycopg.Connection[Any], schema: str = SCHEMA) -> None:
    """Create the members' and owners' tables and the fence function, once."""
    create_once(
        conn,
        f"SELECT to_regprocedure('{schema}.partition_fence(text,integer,text,bigint)')",
        _SCHEMA_LOCK,
        [
            f"CREATE SCHEMA IF NOT EXISTS {schema}",
            f"CREATE TABLE IF NOT EXISTS {schema}.partition_members (grp text, member text,"
            " lock_key bigint NOT NULL, pid integer, host text,"
            " expires_at timestamptz NOT NULL, PRIMARY KEY (grp, member))",
            f"CREATE TABLE IF NOT EXISTS {schema}.partition_owners (grp text,"
            " partition integer, owner text, epoch bigint NOT NULL DEFAULT 0,"
            " expires_at timestamptz NOT NULL DEFAULT '-infinity',"
            " PRIMARY KEY (grp, partition))",
            f"CREATE OR REPLACE FUNCTION {schema}.partition_fence(g text, p integer, o text,"
            " e bigint) RETURNS void LANGUAGE plpgsql AS $$ BEGIN"
            f" PERFORM 1 FROM {schema}.partition_owners WHERE grp = g AND partition = p"
            " AND owner = o AND epoch = e AND expires_at > clock_timestamp() FOR SHARE;"
            " IF NOT FOUND THEN RAISE EXCEPTION"
            " 'partition % of % is no longer owned by % at epoch %', p, g, o, e"
            f" USING ERRCODE = '{FENCED_SQLSTATE}'; END IF; END $$",
        ],
    )


def prepare(dsn: str) -> None:
    """Create the tables and the fence function (once; parts starting together do not race)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        ensure_schema(conn)


def fenced(exc: BaseException) -> bool:
    """Whether a driver error is the fence refusing a write."""
    return isinstance(exc, psycopg.Error) and exc.sqlstate == FENCED_SQLSTATE


class Ownership:
    """This instance's membership of ``group`` and the partitions it owns.

    The heartbeat thread renews the membership and the owned partitions; :meth:`rebalance`
    (called by the owner's own loop, between batches) takes and gives partitions back. The
    owner stops reading a partition *before* it gives it back (:meth:`release`), and learns
    from :meth:`lost` which ones were taken from it.
    """

    def __init__(
        self,
        dsn: str,
        group: str,
        partitions: int,
        timeout_s: float = 10.0,
        member: str | None = None,
        max_poll_interval_s: float | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if max_poll_interval_s is not None and max_poll_interval_s <= 0:
            raise ValueError(f"max_poll_interval_s must be > 0, got {max_poll_interval_s}")
        self.max_poll_interval_s = max_poll_interval_s
        self._polled_at = time.monotonic()
        self._stalled = False
        self.dsn = dsn
        self.group = group
        self.partitions = partitions
        self.timeout_s = timeout_s
        self.member = member or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._owned: dict[int, int] = {}  # partition -> epoch
        self._lost: set[int] = set()
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._keeper_conn: psycopg.Connection[Any] | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._thread: threading.Thread | None = None

    # -- membership ---------------------------------------------------------------------

    def join(self) -> "Ownership":
        """Become a member (its lock, its row, the partitions' rows) and start the heartbeat."""
        self._keeper_conn = self._register()
        self._conn = self._connect()
        self._thread = threading.Thread(
            target=self._heartbeat, name=f"owners-{self.group}", daemon=True
        )
        self._thread.start()
        return self

    @property
    def _idle_ms(self) -> int:
        """How long the database lets a transaction of this member's sit idle (its process
        stopped mid-transaction) before it ends the session: the membership's timeout. A
        stopped member's locks then go with it, as its membership does."""
        return max(1, int(self.timeout_s * 1000))

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(
            self.dsn,
            autocommit=True,
            connect_timeout=10,
            options=f"-c idle_in_transaction_session_timeout={self._idle_ms}",
        )

    def _register(self) -> psycopg.Connection[Any]:
        conn = self._connect()
        try:
            ensure_schema(conn)
            conn.execute(f"SELECT pg_advisory_lock({KEY})", (self._lock_name,))
            conn.execute(
                f"INSERT INTO {SCHEMA}.partition_members"
                " (grp, member, lock_key, pid, host, expires_at)"
                f" VALUES (%s, %s, {KEY}, %s, %s, clock_timestamp() + %s * interval '1 second')"
                " ON CONFLICT (grp, member) DO UPDATE SET expires_at = EXCLUDED.expires_at",
                (
                    self.group,
                    self.member,
                    self._lock_name,
                    os.getpid(),
                    socket.gethostname(),
                    self.timeout_s,
                ),
            )
            conn.execute(
                f"INSERT INTO {SCHEMA}.partition_owners (grp, partition)"
                " SELECT %s, p FROM generate_series(0, %s - 1) p ON CONFLICT DO NOTHING",
                (self.group, self.partitions),
            )
        except BaseException:
            conn.close()
            raise
        return conn

    @property
    def _lock_name(self) -> str:
        return f"partition-member:{self.group}:{self.member}"

    def polled(self) -> None:
        """The owner's loop polled: it is not hung (see ``max_poll_interval_s``)."""
        self._polled_at = time.monotonic()

    def hung(self) -> bool:
        """Whether the owner's loop has not polled for longer than ``max_poll_interval_s``."""
        if self.max_poll_interval_s is None:
            return False
        return time.monotonic() - self._polled_at > self.max_poll_interval_s

    def _heartbeat(self) -> None:
        interval = self.timeout_s / 4
        while not self._stop.wait(interval):
            if self.hung():  # renew nothing: the others take the partitions at expiry
                if not self._stalled:
                    self._stalled = True
                    log.warning(
                        "%s: the loop has not polled for %.1f s (max poll interval %g s):"
                        " no heartbeat until it does; its partitions expire",
                        self.group,
                        time.monotonic() - self._polled_at,
                        self.max_poll_interval_s,
                    )
                continue
            self._stalled = False
            try:
                self.renew()
            except psycopg.Error as exc:
                conn = self._keeper_conn
                if conn is not None and not conn.closed and not conn.broken:
                    log.warning("%s: heartbeat failed (%s); trying again", self.group, exc)
                    continue
                log.warning("%s: heartbeat failed (%s); connecting again", self.group, exc)
                if conn is not None:
                    conn.close()
                with suppress(psycopg.Error):
                    self._keeper_conn = self._register()

    def renew(self) -> None:
        """Extend this member's row and every partition it still owns (at its epoch); a
        partition that is no longer this member's at that epoch is lost."""
        conn = self._keeper_conn
        if conn is None or conn.closed:
            raise psycopg.OperationalError("the heartbeat's connection is closed")
        with self._guard:
            owned = dict(self._owned)
        with conn.transaction():
            conn.execute(
                f"UPDATE {SCHEMA}.partition_members SET expires_at = clock_timestamp()"
                " + %s * interval '1 second' WHERE grp = %s AND member = %s",
                (self.timeout_s, self.group, self.member),
            )
            kept = conn.execute(
                f"UPDATE {SCHEMA}.partition_owners SET expires_at = clock_timestamp()"
                " + %s * interval '1 second' WHERE grp = %s AND owner = %s"
                " AND (partition, epoch) IN (SELECT * FROM unnest(%s::integer[], %s::bigint[]))"
                " RETURNING partition",
                (
                    self.timeout_s,
                    self.group,
                    self.member,
                    list(owned),
                    list(owned.values()),
                ),
            ).fetchall()
        gone = set(owned) - {int(r[0]) for r in kept}
        if gone:
            self._mark_lost(gone, owned)

    def _mark_lost(self, gone: Iterable[int], seen: dict[int, int]) -> None:
        with self._guard:
            for p in gone:
                if self._owned.get(p) == seen.get(p):
                    self._owned.pop(p, None)
                    self._lost.add(p)
        for p in gone:
            log.warning("%s: partition %d was taken over (or expired)", self.group, p)

    # -- the owner's loop ------------------------------------------------------------------

    @property
    def owned(self) -> dict[int, int]:
        """The partitions this member owns, with their epochs."""
        with self._guard:
            return dict(self._owned)

    def lost(self) -> set[int]:
        """The partitions taken from this member since the last call (stop reading them)."""
        with self._guard:
            lost, self._lost = self._lost, set()
        return lost

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop partitions the owner found fenced (its write was refused)."""
        with self._guard:
            for p in partitions:
                self._owned.pop(p, None)

    def rebalance(self) -> tuple[list[int], dict[int, int]]:
        """This member's share now: ``(to_give_back, taken)``: partitions over its share, to
        stop reading and then :meth:`release`, and the partitions it just took (with epochs)."""
        conn = self._main_conn()
        rows = conn.execute(
            f"SELECT m.member FROM {SCHEMA}.partition_members m WHERE m.grp = %s AND {_ALIVE}"
            " ORDER BY m.member",
            (self.group,),
        ).fetchall()
        live = [str(r[0]) for r in rows]
        if self.member not in live:  # paused past the timeout: own nothing until renewed
            return sorted(self.owned), {}
        share, extra = divmod(self.partitions, len(live))
        share += 1 if live.index(self.member) < extra else 0
        owned = self.owned
        if len(owned) > share:
            return sorted(owned)[share:], {}
        if len(owned) == share:
            return [], {}
        taken = conn.execute(
            f"UPDATE {SCHEMA}.partition_owners o SET owner = %(me)s, epoch = o.epoch + 1,"
            " expires_at = clock_timestamp() + %(ttl)s * interval '1 second'"
            " WHERE o.grp = %(g)s AND o.partition IN ("
            f"  SELECT f.partition FROM {SCHEMA}.partition_owners f WHERE f.grp = %(g)s"
            "   AND f.partition < %(n)s AND (f.owner IS NULL"
            "    OR f.expires_at <= clock_timestamp() OR NOT EXISTS ("
            f"     SELECT 1 FROM {SCHEMA}.partition_members m WHERE m.grp = %(g)s"
            f"      AND m.member = f.owner AND {_ALIVE}))"
            "   ORDER BY f.partition LIMIT %(want)s FOR UPDATE SKIP LOCKED)"
            " RETURNING o.partition, o.epoch",
            {
                "me": self.member,
                "ttl": self.timeout_s,
                "g": self.group,
                "n": self.partitions,
                "want": share - len(owned),
            },
        ).fetchall()
        got = {int(p): int(e) for p, e in taken}
        with self._guard:
            self._owned.update(got)
        if got:
            conn.execute(
                f"DELETE FROM {SCHEMA}.partition_members m WHERE m.grp = %s"
                " AND m.expires_at < clock_timestamp() - interval '1 hour'",
                (self.group,),
            )
        return [], got

    def release(self, partitions: Iterable[int]) -> None:
        """Give partitions back (the owner stopped reading them): free at once for others."""
        chosen = list(partitions)
        with self._guard:
            epochs = {p: self._owned.pop(p) for p in chosen if p in self._owned}
        if not epochs:
            return
        self._main_conn().execute(
            f"UPDATE {SCHEMA}.partition_owners SET owner = NULL, expires_at = clock_timestamp()"
            " WHERE grp = %s AND owner = %s"
            " AND (partition, epoch) IN (SELECT * FROM unnest(%s::integer[], %s::bigint[]))",
            (self.group, self.member, list(epochs), list(epochs.values())),
        )

    def fence(self, partition: int) -> tuple[str, dict[str, Any]]:
        """The fencing statement for a write for ``partition`` (``%(name)s`` parameters) and
        its parameters: run it in the write's transaction, before the write."""
        epoch = self.owned.get(partition)
        if epoch is None:
            raise PartitionFencedError(f"partition {partition} of {self.group} is not owned")
        return FENCE_SQL, {
            "fence_idle_ms": str(self._idle_ms),
            "fence_group": self.group,
            "fence_partition": partition,
            "fence_owner": self.member,
            "fence_epoch": epoch,
        }

    def _main_conn(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        return self._conn

    def leave(self) -> None:
        """Give every partition back and leave the group (a graceful stop)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        with suppress(psycopg.Error):
            self.release(self.owned)
            self._main_conn().execute(
                f"DELETE FROM {SCHEMA}.partition_members WHERE grp = %s AND member = %s",
                (self.group, self.member),
            )
        for conn in (self._conn, self._keeper_conn):
            if conn is not None:
                conn.close()
        self._conn = self._keeper_conn = None


FENCE_SQL = (
    # A write's transaction left idle (its process stopped, its VM frozen) would keep the row's
    # lock, and a take-over skips a locked row: the database ends it after the timeout.
    "SELECT set_config('idle_in_transaction_session_timeout', %(fence_idle_ms)s, true),"
    f" {SCHEMA}.partition_fence(%(fence_group)s::text, %(fence_partition)s::integer,"
    " %(fence_owner)s::text, %(fence_epoch)s::bigint)"
)


def owners(dsn: str, group: str) -> dict[int, tuple[str | None, int]]:
    """Each partition's owner and epoch now (for status and tests)."""
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        found = conn.execute("SELECT to_regclass(%s)", (f"{SCHEMA}.partition_owners",)).fetchone()
        if found is None or found[0] is None:
            return {}  # no processor has started yet
        rows = conn.execute(
            f"SELECT partition, owner, epoch FROM {SCHEMA}.partition_owners WHERE grp = %s",
            (group,),
        ).fetchall()
    return {int(p): (o, int(e)) for p, o, e in rows}
