"""Table layouts of the PostgreSQL store and the SQL that turns staged JSON into column values.

Two layouts:

- **generic**: ``(key text PRIMARY KEY, _position bigint, _applied_count bigint, fields jsonb)``,
  any fields; lookups get an expression index.
- **typed** (:class:`TypedTable`): one column per field with its own SQL type, a primary key of
  real columns, plus ``_position`` and ``_applied_count``. A write's fields arrive as JSON; each
  column says how its value is encoded there (:data:`Encoding`) and is converted in SQL, so a
  mirror holds the source's types and values, not guesses.

Each layout has a side table ``<table>__deleted (key text PRIMARY KEY, _position bigint)`` that
keeps the position of deleted keys, so an old re-sent insert cannot bring a key back.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from psycopg import sql

POSITION = "_position"
APPLIED = "_applied_count"
META_COLUMNS = (POSITION, APPLIED)

Encoding = Literal[
    "json",  # the JSON value as the column type's text input (numbers, strings, booleans)
    "json_array",  # a JSON array into an SQL array
    "json_text",  # a string holding a JSON document (Debezium's io.debezium.data.Json)
    "json_value",  # any JSON value kept as jsonb
    "epoch_days",  # days since 1970-01-01 (Debezium's io.debezium.time.Date)
    "epoch_millis",  # ms since the epoch, no zone (io.debezium.time.Timestamp)
    "epoch_micros",  # µs since the epoch, no zone (io.debezium.time.MicroTimestamp)
    "epoch_nanos",  # ns since the epoch, no zone (io.debezium.time.NanoTimestamp)
    "micros_of_day",  # µs since midnight (io.debezium.time.MicroTime)
    "millis_of_day",  # ms since midnight (io.debezium.time.Time)
    "micros_duration",  # µs (io.debezium.time.MicroDuration)
    "base64",  # bytes as base64 text
]


@dataclass(frozen=True)
class TypedColumn:
    """A column: its name, its SQL type as ``format_type`` writes it, its JSON encoding."""

    name: str
    sql_type: str
    encoding: Encoding = "json"

    def value_sql(self, source: sql.Composable) -> sql.Composable:
        """The column's value from the JSON object ``source`` (an SQL jsonb expression)."""
        name = sql.Literal(self.name)
        text = sql.SQL("({} ->> {})").format(source, name)
        kind = sql.SQL(self.sql_type)
        match self.encoding:
            case "json":
                return sql.SQL("{}::{}").format(text, kind)
            case "json_array":
                node = sql.SQL("({} -> {})").format(source, name)
                return sql.SQL(
                    "(CASE WHEN jsonb_typeof({n}) = 'array' THEN"
                    " ARRAY(SELECT jsonb_array_elements_text({n})) END)::{k}"
                ).format(n=node, k=kind)
            case "json_text":
                return sql.SQL("{}::{}").format(text, kind)
            case "json_value":
                return sql.SQL("({} -> {})::{}").format(source, name, kind)
            case "epoch_days":
                return sql.SQL("(date '1970-01-01' + {}::integer)::{}").format(text, kind)
            case "epoch_millis" | "epoch_micros" | "epoch_nanos":
                unit = {
                    "epoch_millis": "1 millisecond",
                    "epoch_micros": "1 microsecond",
                    "epoch_nanos": "0.001 microsecond",
                }[self.encoding]
                return sql.SQL("(timestamp '1970-01-01' + {}::numeric * interval {})::{}").format(
                    text, sql.Literal(unit), kind
                )
            case "micros_of_day" | "millis_of_day":
                unit = "1 microsecond" if self.encoding == "micros_of_day" else "1 millisecond"
                return sql.SQL("(time '00:00' + {}::bigint * interval {})::{}").format(
                    text, sql.Literal(unit), kind
                )
            case "micros_duration":
                return sql.SQL("({}::bigint * interval '1 microsecond')::{}").format(text, kind)
            case "base64":
                return sql.SQL("decode({}, 'base64')::{}").format(text, kind)
        raise ValueError(f"unknown encoding {self.encoding!r}")  # pragma: no cover


ColumnSource = Callable[[], "TypedTable"]
"""Reads the table's layout again (e.g. from the source table's catalog) when a field appears
that the table lacks, or when the layout was not known yet."""


@dataclass(frozen=True)
class TypedTable:
    """A collection held as a typed table named ``table``, keyed by ``key`` columns.

    An entry's key is the JSON object of its key columns (``{"id": 7}``). ``refresh`` is asked
    for the layout again when a write carries a field the table lacks (or when ``columns`` is
    empty: the source table did not exist yet); a field it does not know either is added as
    ``jsonb`` holding the JSON value (and said so in the log).
    """

    collection: str
    table: str
    columns: tuple[TypedColumn, ...]
    key: tuple[str, ...]
    refresh: ColumnSource | None = field(default=None, compare=False)

    def column(self, name: str) -> TypedColumn | None:
        for column in self.columns:
            if column.name == name:
                return column
        return None

    def with_columns(self, columns: Sequence[TypedColumn]) -> "TypedTable":
        return replace(self, columns=tuple(columns))


def ident(schema: str, table: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))


def generation_table(base: str, generation: str | None) -> str:
    """The table of a generation: the base name when live, ``<base>__<generation>`` when shadow."""
    return base if generation is None else f"{base}__{generation}"


def deleted_table(table: str) -> str:
    return f"{table}__deleted"
