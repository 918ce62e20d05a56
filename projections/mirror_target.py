"""Where the generations of a mirror view live: the live table, shadow tables for rebuilds,
and the atomic swap that makes a rebuilt shadow the live table."""

import uuid
from typing import Any

import psycopg

from projections.ledger import ViewLedger
from projections.mirror_sink import BatchHook, PostgresMirrorSink
from projections.mirror_table import MirrorTable, drop_mirror_table, rename_mirror_table


def new_generation() -> str:
    """A fresh generation id (short, safe inside a table name)."""
    return "g" + uuid.uuid4().hex[:10]


class MirrorTarget:
    """A mirror view's tables in PostgreSQL, per generation.

    The live generation writes ``table``; a rebuild writes ``<table>__<generation>`` and
    :meth:`swap_in` renames it to ``table`` in one transaction, so readers of ``table`` see
    either the old or the new table, never an error.
    """

    def __init__(self, dsn: str, view: str, table: MirrorTable) -> None:
        self.dsn = dsn
        self.view = view
        self.table = table
        self.ledger = ViewLedger(table.schema)

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn, autocommit=False)

    def live_generation(self) -> str:
        """The live generation; the first call for a view makes a new one live."""
        with self._connect() as conn, conn.transaction():
            self.ledger.ensure(conn)
            return self.ledger.claim(conn, self.view, new_generation())

    def shadow(self, generation: str) -> MirrorTable:
        return self.table.with_name(f"{self.table.name}__{generation}")

    def sink(
        self,
        generation: str,
        *,
        live: bool,
        before_commit: BatchHook | None = None,
        after_commit: BatchHook | None = None,
    ) -> PostgresMirrorSink:
        """The sink of one generation: the live table, or the generation's shadow table."""
        return PostgresMirrorSink(
            self.dsn,
            self.view,
            generation,
            self.table if live else self.shadow(generation),
            live=live,
            before_commit=before_commit,
            after_commit=after_commit,
        )

    def prepare(self, generation: str) -> None:
        """Start a rebuild: an empty shadow, and the generation recorded as in use."""
        self.discard(generation)
        with self._connect() as conn, conn.transaction():
            self.ledger.register(conn, self.view, generation)

    def generations(self) -> set[str]:
        """Generations in use (live or being built); any other is retired."""
        with self._connect() as conn, conn.transaction():
            self.ledger.ensure(conn)
            return self.ledger.generations(conn, self.view)

    def discard(self, generation: str) -> None:
        """Drop a rebuild's shadow table and ledger row; the live view is not touched."""
        with self._connect() as conn, conn.transaction():
            self.ledger.ensure(conn)
            drop_mirror_table(conn, self.shadow(generation))
            self.ledger.forget(conn, self.view, generation)

    def swap_in(self, generation: str) -> str | None:
        """Make ``generation`` live atomically; returns the generation it replaced."""
        retired = self.table.with_name(f"{self.table.name}__retired")
        with self._connect() as conn, conn.transaction():
            self.ledger.ensure(conn)
            previous = self.ledger.make_live(conn, self.view, generation)
            drop_mirror_table(conn, retired)
            rename_mirror_table(conn, self.table, retired.name)
            rename_mirror_table(conn, self.shadow(generation), self.table.name)
            drop_mirror_table(conn, retired)
            if previous is not None and previous != generation:
                self.ledger.forget(conn, self.view, previous)
        return previous
