"""PostgreSQL access: SQLAlchemy 2 engines over psycopg 3."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.engine import URL


def make_url(url: str) -> "URL":
    """SQLAlchemy's parsed URL (SQLAlchemy is imported on first use: the CLI's settings hold
    a :class:`PostgresConfig` without paying for it)."""
    from sqlalchemy.engine import make_url as parse

    return parse(url)


@dataclass(frozen=True)
class PostgresConfig:
    """A SQLAlchemy URL (``postgresql+psycopg://user[:password]@host:port/db``)."""

    url: str
    pool_size: int = 5

    def __repr__(self) -> str:  # never the password
        return f"PostgresConfig(url={self.redacted_url!r}, pool_size={self.pool_size})"

    @property
    def redacted_url(self) -> str:
        """The URL with its password masked, for messages."""
        return make_url(self.url).render_as_string(hide_password=True)

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


def make_engine(config: PostgresConfig) -> "Engine":
    """An engine with a small pool, pre-ping on checkout, and psycopg 3 as the driver."""
    from sqlalchemy import create_engine

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


def compare_tables(
    dsn: str, source: tuple[str, str], copy: tuple[str, str], columns: list[str], keys: list[str]
) -> dict[str, int]:
    """Rows of ``source`` missing from ``copy`` or different there (``stale``), and keys of
    ``copy`` the source no longer has (``extra``), compared on ``columns`` (same database)."""
    import psycopg
    from psycopg import sql

    src, dst = sql.Identifier(*source), sql.Identifier(*copy)
    cols = sql.SQL(", ").join(map(sql.Identifier, columns))
    key = sql.SQL(", ").join(map(sql.Identifier, keys))
    with psycopg.connect(dsn) as conn:
        differing = conn.execute(
            sql.SQL(
                "SELECT count(*) FROM (SELECT {cols} FROM {src} EXCEPT SELECT {cols} FROM {dst}) d"
            ).format(cols=cols, src=src, dst=dst)
        ).fetchone()
        absent = conn.execute(
            sql.SQL(
                "SELECT count(*) FROM (SELECT {key} FROM {src} EXCEPT SELECT {key} FROM {dst}) d"
            ).format(key=key, src=src, dst=dst)
        ).fetchone()
        extra = conn.execute(
            sql.SQL(
                "SELECT count(*) FROM (SELECT {key} FROM {dst} EXCEPT SELECT {key} FROM {src}) d"
            ).format(key=key, src=src, dst=dst)
        ).fetchone()
    missing = int(absent[0]) if absent else 0
    stale = (int(differing[0]) if differing else 0) - missing
    return {"missing": missing, "stale": stale, "extra": int(extra[0]) if extra else 0}
