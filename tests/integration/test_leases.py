"""Leases' table: created once however many parts start at the same moment."""

import threading

import psycopg

from connectors.leases import ensure_schema
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
