"""The views' read-only PostgreSQL role: what the serving side (HTTP API, ``tributary query``)
connects as, so a bug or an injection there can read the views and nothing else.

:func:`grant_read_role` gives a role ``USAGE`` on the views schema, ``SELECT`` on every table in
it, and default privileges so the tables created there later (a replay's new generation, a new
view) are readable too. It grants nothing else: the role cannot write, create or read the
event store.
"""

from typing import Any

import psycopg
from psycopg import sql

from connectors.errors import ReadRoleError

_POWERS = (
    ("rolsuper", "SUPERUSER"),
    ("rolcreaterole", "CREATEROLE"),
    ("rolcreatedb", "CREATEDB"),
    ("rolreplication", "REPLICATION"),
    ("rolbypassrls", "BYPASSRLS"),
)


def grant_read_role(
    conn: psycopg.Connection[Any],
    views_schema: str,
    role: str,
    *,
    password: str | None = None,
    writer: str | None = None,
) -> None:
    """Make ``role`` (created when missing, as a login role) able to read ``views_schema`` and
    only that, now and for tables ``writer`` (default: the connected user, who runs the view
    jobs) creates there later. ``password`` is sent SCRAM-hashed, never in clear text.

    Raises :class:`ReadRoleError` for a role that can already do more than read (a superuser,
    a member of another role, the schema's owner).
    """
    with conn.transaction():
        current = conn.execute("SELECT current_user, current_database()").fetchone()
        assert current is not None
        writer = writer or str(current[0])
        if role in (writer, str(current[0])):
            raise ReadRoleError(
                f"role {role} writes the views: choose another name for the read-only role"
            )
        exists = _check_existing(conn, views_schema, role)
        ident = sql.Identifier(role)
        options: sql.Composable = sql.SQL(
            " LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
        )
        if password is not None:
            options += sql.SQL(" PASSWORD {}").format(sql.Literal(_hashed(conn, role, password)))
        verb = sql.SQL("ALTER ROLE" if exists else "CREATE ROLE")
        conn.execute(sql.SQL("{} {}").format(verb, ident) + options)
        schema = sql.Identifier(views_schema)
        conn.execute(
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(
                schema, sql.Identifier(writer)
            )
        )
        statements = (
            "GRANT CONNECT ON DATABASE {db} TO {role}",
            "GRANT USAGE ON SCHEMA {schema} TO {role}",
            "GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}",
            "ALTER DEFAULT PRIVILEGES FOR ROLE {writer} IN SCHEMA {schema}"
            " GRANT SELECT ON TABLES TO {role}",
        )
        for statement in statements:
            conn.execute(
                sql.SQL(statement).format(
                    db=sql.Identifier(str(current[1])),
                    schema=schema,
                    role=ident,
                    writer=sql.Identifier(writer),
                )
            )


def drop_read_role(
    conn: psycopg.Connection[Any], views_schema: str, role: str, *, writer: str | None = None
) -> None:
    """Take back what :func:`grant_read_role` granted in this database and drop the role."""
    with conn.transaction():
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
            return
        ident = sql.Identifier(role)
        if writer is not None:
            conn.execute(
                sql.SQL(
                    "ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA {}"
                    " REVOKE SELECT ON TABLES FROM {}"
                ).format(sql.Identifier(writer), sql.Identifier(views_schema), ident)
            )
        # Removes every privilege granted to the role here, default privileges included.
        conn.execute(sql.SQL("DROP OWNED BY {}").format(ident))
        conn.execute(sql.SQL("DROP ROLE {}").format(ident))


def _check_existing(conn: psycopg.Connection[Any], views_schema: str, role: str) -> bool:
    """Whether the role exists; refuses one that can do more than read."""
    columns = sql.SQL(", ").join(sql.Identifier(c) for c, _ in _POWERS)
    row = conn.execute(
        sql.SQL("SELECT {}, oid FROM pg_roles WHERE rolname = %s").format(columns), (role,)
    ).fetchone()
    if row is None:
        return False
    powers = [name for (_, name), has in zip(_POWERS, row[:-1], strict=True) if has]
    if powers:
        raise ReadRoleError(f"role {role} has {', '.join(powers)}: it cannot be read-only")
    member_of = conn.execute(
        "SELECT r.rolname FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid"
        " WHERE m.member = %s ORDER BY 1",
        (row[-1],),
    ).fetchall()
    if member_of:
        names = ", ".join(str(r[0]) for r in member_of)
        raise ReadRoleError(
            f"role {role} is a member of {names} and gets their privileges: use a role of its own"
        )
    owner = conn.execute(
        "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = %s", (views_schema,)
    ).fetchone()
    if owner is not None and owner[0] == role:
        raise ReadRoleError(f"role {role} owns schema {views_schema}: it cannot be read-only")
    return True


def _hashed(conn: psycopg.Connection[Any], role: str, password: str) -> str:
    """The password as PostgreSQL stores it (SCRAM-SHA-256), hashed here by libpq."""
    hashed = conn.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256")
    return hashed.decode()
