"""The mirror's PostgreSQL table: the source's columns (inferred from the change rows, added as
they appear), plus ``_position`` (the LSN of the row's last change) and ``_applied_count`` (how
many changes built the row since it was inserted), and a side table ``<name>__deleted`` keeping
the position of each deleted key so an old re-sent insert cannot bring a deleted row back.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from projections.errors import SinkError

POSITION = "_position"
APPLIED = "_applied_count"
META_COLUMNS = (POSITION, APPLIED)


def column_type(value: Any) -> str | None:
    """The PostgreSQL type for a JSON value (None: unknown yet, the value is null).

    Numbers map to ``numeric`` so an integer column that later carries a fraction still fits.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "numeric"
    if isinstance(value, str):
        return "text"
    return "jsonb"


@dataclass(frozen=True)
class MirrorTable:
    """Where a mirror lives: ``schema.name`` and its ``schema.name__deleted`` side table."""

    schema: str
    name: str

    @property
    def deleted_name(self) -> str:
        return f"{self.name}__deleted"

    @property
    def ident(self) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(self.name))

    @property
    def deleted_ident(self) -> sql.Composed:
        return sql.SQL("{}.{}").format(
            sql.Identifier(self.schema), sql.Identifier(self.deleted_name)
        )

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    def with_name(self, name: str) -> "MirrorTable":
        return MirrorTable(self.schema, name)


class TableShape:
    """The columns and primary key of a mirror table, created and widened on demand."""

    def __init__(self, table: MirrorTable) -> None:
        self.table = table
        self.columns: dict[str, str] = {}
        self.key: list[str] = []

    @property
    def exists(self) -> bool:
        return bool(self.key)

    def load(self, conn: psycopg.Connection[Any]) -> None:
        rows = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
            (self.table.schema, self.table.name),
        ).fetchall()
        self.columns = {str(r[0]): str(r[1]) for r in rows}
        if not rows:
            self.key = []
            return
        keys = conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a"
            " ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
            " WHERE i.indrelid = %s::regclass AND i.indisprimary ORDER BY a.attnum",
            (self.table.qualified,),
        ).fetchall()
        self.key = [str(r[0]) for r in keys]

    def ensure(
        self,
        conn: psycopg.Connection[Any],
        keys: Iterable[Mapping[str, Any]],
        rows: Iterable[Mapping[str, Any]],
    ) -> None:
        """Create the table (from the first key) and add columns first seen in ``rows``."""
        new: dict[str, str] = {}
        for row in rows:
            for column, value in row.items():
                if column not in self.columns and column not in new:
                    kind = column_type(value)
                    if kind is not None:
                        new[column] = kind
        if not self.exists:
            first = next(iter(keys), None)
            if first is None:
                return
            self._create(conn, first, new)
            return
        for column, kind in new.items():
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                    self.table.ident, sql.Identifier(column), sql.SQL(kind)
                )
            )
            self.columns[column] = kind

    def _create(
        self, conn: psycopg.Connection[Any], key: Mapping[str, Any], columns: dict[str, str]
    ) -> None:
        key_types = {}
        for column, value in key.items():
            kind = column_type(value) or columns.get(column)
            if kind is None:
                raise SinkError(f"key column {column} of {self.table.qualified} is null")
            key_types[column] = kind
        all_columns = {**key_types, **{c: k for c, k in columns.items() if c not in key_types}}
        defs = [
            sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(k)) for c, k in all_columns.items()
        ]
        defs.append(sql.SQL("{} bigint NOT NULL").format(sql.Identifier(POSITION)))
        defs.append(sql.SQL("{} bigint NOT NULL").format(sql.Identifier(APPLIED)))
        defs.append(
            sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, key_types)))
        )
        conn.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                self.table.ident, sql.SQL(", ").join(defs)
            )
        )
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (k jsonb PRIMARY KEY, {} bigint NOT NULL)"
            ).format(self.table.deleted_ident, sql.Identifier(POSITION))
        )
        self.columns = {**all_columns, POSITION: "bigint", APPLIED: "bigint"}
        self.key = list(key_types)

    @property
    def data_columns(self) -> list[str]:
        return [c for c in self.columns if c not in META_COLUMNS]


def drop_mirror_table(conn: psycopg.Connection[Any], table: MirrorTable) -> None:
    """Drop a mirror table and its side table if they exist."""
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table.ident))
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table.deleted_ident))


def rename_mirror_table(conn: psycopg.Connection[Any], table: MirrorTable, new_name: str) -> None:
    """Rename a mirror table and its side table (if they exist) within the schema."""
    target = table.with_name(new_name)
    for old, new in ((table.name, target.name), (table.deleted_name, target.deleted_name)):
        conn.execute(
            sql.SQL("ALTER TABLE IF EXISTS {}.{} RENAME TO {}").format(
                sql.Identifier(table.schema), sql.Identifier(old), sql.Identifier(new)
            )
        )
