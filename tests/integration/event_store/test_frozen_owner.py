"""An owner stopped in the middle of a fenced write (its process stopped, its VM frozen) keeps
its transaction open and, with it, its partition row's lock; a take-over skips locked rows. The
database ends such a transaction after the membership's timeout, so the partition is taken and
the frozen write can never commit (found by CI: a processor paused under load kept a partition
from the others for good)."""

import time

import psycopg
import pytest

from connectors.partition_owners import Ownership, prepare
from tests.integration.conftest import Endpoints

TIMEOUT_S = 2.0


def test_a_write_frozen_in_its_transaction_does_not_keep_its_partition(
    stack: Endpoints, unique: str
) -> None:
    dsn = stack.postgres_dsn
    prepare(dsn)
    group = f"frozen-{unique}"
    frozen = Ownership(dsn, group, 2, TIMEOUT_S).join()
    other: Ownership | None = None
    write: psycopg.Connection | None = None
    try:
        frozen.rebalance()
        assert sorted(frozen.owned) == [0, 1]
        write = psycopg.connect(dsn)  # a write's transaction: the fence, then nothing more
        sql, params = frozen.fence(0)
        write.execute(sql, params)
        frozen._stop.set()  # its heartbeat stops too, as the whole process would
        assert frozen._thread is not None
        frozen._thread.join(10)

        other = Ownership(dsn, group, 2, TIMEOUT_S).join()
        began = time.monotonic()
        while sorted(other.owned) != [0, 1] and time.monotonic() - began < 6 * TIMEOUT_S:
            other.rebalance()
            time.sleep(0.1)
        assert sorted(other.owned) == [0, 1], other.owned  # partition 0 too: its lock is gone
        with pytest.raises(
            psycopg.errors.IdleInTransactionSessionTimeout
        ):  # the frozen write's session was ended
            write.execute("SELECT 1")
    finally:
        if write is not None:
            write.close()  # first: a release waits for the lock its transaction holds
        for member in (frozen, other):
            if member is not None:
                member.leave()
