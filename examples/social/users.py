"""Users: a plain CRUD table (no event sourcing), captured by CDC like any table."""

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    DateTime,
    MetaData,
    Select,
    Table,
    Text,
    bindparam,
    func,
    literal_column,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import insert, psycopg


def users_table(schema: str | None = None) -> Table:
    """``users(id bigint primary key, handle text unique, display_name, bio, updated_at)``."""
    return Table(
        "users",
        MetaData(schema=schema),
        Column("id", BigInteger, primary_key=True, autoincrement=False),
        Column("handle", Text, unique=True, nullable=False),
        Column("display_name", Text),
        Column("bio", Text),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    )


def create_users_table(connection: Connection, schema: str | None = None) -> Table:
    """Create the table if absent (in ``schema``, or the search path's first schema)."""
    if schema is not None:
        connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
    table = users_table(schema)
    table.metadata.create_all(connection, checkfirst=True)
    return table


def upsert_user(
    connection: Connection,
    table: Table,
    user_id: int,
    handle: str,
    display_name: str | None = None,
    bio: str | None = None,
    updated_at: datetime | None = None,
) -> None:
    """Insert or update one user (a CRUD write)."""
    values = {
        "id": user_id,
        "handle": handle,
        "display_name": display_name,
        "bio": bio,
        "updated_at": updated_at or func.now(),
    }
    statement = insert(table).values(**values)
    connection.execute(
        statement.on_conflict_do_update(
            index_elements=[table.c.id],
            set_={k: statement.excluded[k] for k in values if k != "id"},
        )
    )


def user_exists(connection: Connection, table: Table, user_id: int) -> bool:
    return connection.execute(select(table.c.id).where(table.c.id == user_id)).first() is not None


def user_exists_sql(table: Table) -> str:
    """``user_exists`` as SQL for the driver (``HandlerContext.query_one``), parameter
    ``%(user_id)s``: the handlers run it on every post and follow."""
    statement: Select[Any] = select(literal_column("1")).where(table.c.id == bindparam("user_id"))
    dialect = psycopg.dialect()  # type: ignore[no-untyped-call]
    return str(statement.compile(dialect=dialect))
