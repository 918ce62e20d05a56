"""Leases: the table created once however many parts start at the same moment; a standby that
sees a held lease without taking it."""

import threading

import psycopg

from connectors.leases import Lease, ensure_schema, prepare
from tests.integration.conftest import Endpoints


def test_parts_starting_together_create_the_leases_table_once(
    stack: Endpoints, unique: str
) -> None:
    schema = f"leases_{unique}"
    start, errors = threading.Barrier(8), []

    def part() -> None:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            start.wait()
            try:
                ensure_schema(conn, schema)
            except psycopg.Error as exc:  # the race: UniqueViolation on pg_type's index
                errors.append(exc)

    threads = [threading.Thread(target=part) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        assert errors == []
        with psycopg.connect(stack.postgres_dsn) as conn:
            row = conn.execute("SELECT to_regclass(%s)", (f"{schema}.leases",)).fetchone()
        assert row is not None and row[0] is not None
    finally:
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_a_standby_sees_a_held_lease_without_taking_it(stack: Endpoints, unique: str) -> None:
    """`tributary run views-standby` waits until the primary holds a view's lease: asking must
    not take it, or the standby would win the race at start."""
    prepare(stack.postgres_dsn)
    primary, standby = (
        Lease(stack.postgres_dsn, f"t:{unique}"),
        Lease(stack.postgres_dsn, f"t:{unique}"),
    )
    assert not standby.held_elsewhere()
    assert not standby.held  # asked, not taken: the primary still gets it
    primary.acquire()
    try:
        assert standby.held_elsewhere()
        assert not standby.try_acquire()
    finally:
        primary.release()
    assert not standby.held_elsewhere()
    assert standby.try_acquire()
    standby.release()
