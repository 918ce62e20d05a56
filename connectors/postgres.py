"""PostgreSQL access: SQLAlchemy 2 engines over psycopg 3."""

from dataclasses import dataclass

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url


@dataclass(frozen=True)
class PostgresConfig:
    """A SQLAlchemy URL (``postgresql+psycopg://user[:password]@host:port/db``)."""

    url: str
    pool_size: int = 5

    @property
    def dsn(self) -> str:
        """The libpq form, for psycopg directly and for tools."""
        return self.url.replace("postgresql+psycopg://", "postgresql://", 1)

    @property
    def host(self) -> str:
        return make_url(self.url).host or "127.0.0.1"

    @property
    def port(self) -> int:
        return make_url(self.url).port or 5432

    @property
    def user(self) -> str:
        return make_url(self.url).username or "postgres"

    @property
    def password(self) -> str:
        return make_url(self.url).password or ""

    @property
    def database(self) -> str:
        return make_url(self.url).database or "postgres"


def make_engine(config: PostgresConfig) -> Engine:
    """An engine with a small pool, pre-ping on checkout, and psycopg 3 as the driver."""
    url = make_url(config.url)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return create_engine(url, pool_size=config.pool_size, pool_pre_ping=True)


@dataclass(frozen=True)
class SourceColumn:
    """A column of a table as the PostgreSQL catalog describes it."""

    name: str
    sql_type: str  # format_type(): "integer", "numeric(10,2)", "timestamp(3) without time zone"
    type_name: str  # pg_type.typname: "int4", "numeric", "timestamp", "_text"
    category: str  # pg_type.typcategory: "N", "S", "D", "A", ...
    precision: int | None  # fractional-second digits of time types (None: the default, 6)
    primary_key: bool


_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), t.typname, t.typcategory,
       CASE WHEN t.typname IN ('timestamp', 'timestamptz', 'time', 'timetz') AND a.atttypmod >= 0
            THEN a.atttypmod END,
       coalesce(a.attnum = ANY(i.indkey), false)
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


def table_columns(dsn: str, schema: str, table: str) -> list[SourceColumn]:
    """The columns of ``schema.table`` (empty when the table does not exist)."""
    import psycopg
    from psycopg import sql

    name = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(_COLUMNS, (name.as_string(conn),)).fetchall()
    return [
        SourceColumn(str(r[0]), str(r[1]), str(r[2]), str(r[3]), r[4], bool(r[5])) for r in rows
    ]
