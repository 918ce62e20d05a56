"""The views' read-only PostgreSQL role on the real PostgreSQL: it reads the views' tables,
those created after the grant included (a view's first batch, a replay's new generation), and
nothing else; the serving side (the timeline query) reads through it."""

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from connectors.errors import ReadRoleError, StoreUnavailableError
from connectors.roles import drop_read_role, grant_read_role
from examples.social.views import timeline_view
from examples.social.views.folds import FOLLOWS, POSTS
from infra.stack.isolated import settings_env
from projections.view import View
from tests.integration.conftest import Endpoints
from tributary.view_model import Batch, Put
from tributary.view_store import new_generation

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ReadRole:
    schema: str
    role: str
    password: str
    dsn: str  # connects as the role


def role_dsn(admin_dsn: str, role: str, password: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(admin_dsn)
    info.update(user=role, password=password)
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items()})


@pytest.fixture
def read_role(stack: Endpoints, unique: str) -> Iterator[ReadRole]:
    schema, role, password = f"views_ro_{unique}", f"reader_{unique}", f"pw-{unique}"
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as admin:
        grant_read_role(admin, schema, role, password=password)
    yield ReadRole(schema, role, password, role_dsn(stack.postgres_dsn, role, password))
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        admin.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(f"secret_{unique}")))
        drop_read_role(admin, schema, role)
        drop_read_role(admin, schema, f"nobody_{unique}")


def timeline(stack: Endpoints, role: ReadRole, unique: str, read_dsn: str) -> View:
    topics = (f"t{unique}.posts", f"t{unique}.follows")
    return timeline_view(
        stack.postgres_dsn,
        role.schema,
        topics,
        f"timeline_{unique}",
        read_dsn=read_dsn,
        registry_url=stack.settings.registry_url,
    )


def first_batch(view: View, generation: str, text: str) -> None:
    post = {
        "post_id": 10,
        "author_id": 2,
        "text": text,
        "hashtags": ["cdc"],
        "created_at": "2026-01-01T00:00:00+00:00",
        "edited_at": None,
    }
    follow = {"follower_id": 1, "followee_id": 2, "followed_at": None}
    writes = [Put(POSTS, "10", 1, post, fresh=True), Put(FOLLOWS, "1:2", 1, follow, fresh=True)]
    writer = view.store.writer(generation, live=view.store.live_generation() == generation)
    try:
        writer.apply(Batch(0, {view.topics[0]: {"0": 1}}, writes))
    finally:
        writer.close()


def as_role(role: ReadRole, statement: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(role.dsn, autocommit=True) as conn:
        return conn.execute(statement, args or None).fetchall()


def test_the_role_reads_tables_created_after_the_grant_and_cannot_write(
    stack: Endpoints, read_role: ReadRole, unique: str
) -> None:
    view = timeline(stack, read_role, unique, read_role.dsn)
    first_batch(view, view.store.live_generation(), "first")  # creates the tables now
    [query] = view.queries
    assert [p["text"] for p in query.run(user_id=1)] == ["first"]

    table = f"{read_role.schema}.timeline"
    assert as_role(read_role, f"SELECT count(*) FROM {table}") == [(1,)]
    refused = [
        f"INSERT INTO {table} (user_id, post_id) VALUES (9, 9)",
        f"UPDATE {table} SET text = 'changed'",
        f"DELETE FROM {table}",
        f"TRUNCATE {table}",
        f"CREATE TABLE {read_role.schema}.planted (x int)",
        f"CREATE SCHEMA planted_{unique}",
        f"DROP TABLE {table}",
    ]
    for statement in refused:
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
            as_role(read_role, statement)
        assert "permission denied" in str(caught.value) or "must be owner" in str(caught.value)

    # A replay: a new generation's tables, created and swapped in after the grant.
    shadow = new_generation()
    view.store.prepare(shadow)
    first_batch(view, shadow, "replayed")
    view.store.swap_in(shadow)
    assert [p["text"] for p in query.run(user_id=1)] == ["replayed"]


def test_the_role_reads_nothing_outside_the_views_schema(
    stack: Endpoints, read_role: ReadRole, unique: str
) -> None:
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE TABLE {} (x int)").format(sql.Identifier(f"secret_{unique}")))
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_role(read_role, f"SELECT * FROM public.secret_{unique}")


def test_the_query_reads_through_the_read_role(
    stack: Endpoints, read_role: ReadRole, unique: str
) -> None:
    """A role without the grant cannot answer the timeline query: the query uses read_dsn."""
    view = timeline(stack, read_role, unique, read_role.dsn)
    first_batch(view, view.store.live_generation(), "first")
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(f"nobody_{unique}")))
        admin.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(read_role.schema), sql.Identifier(f"nobody_{unique}")
            )
        )
    nobody = role_dsn(stack.postgres_dsn, f"nobody_{unique}", "x")
    [query] = timeline(stack, read_role, unique, nobody).queries
    with pytest.raises(StoreUnavailableError, match="grant-read-role"):
        query.run(user_id=1)


def test_grants_are_idempotent_and_refuse_roles_that_can_do_more(
    stack: Endpoints, read_role: ReadRole, unique: str
) -> None:
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as admin:
        grant_read_role(admin, read_role.schema, read_role.role, password="new-password")
        stored = admin.execute(
            "SELECT rolpassword FROM pg_authid WHERE rolname = %s", (read_role.role,)
        ).fetchone()
        assert stored is not None and str(stored[0]).startswith("SCRAM-SHA-256$")  # hashed
        with pytest.raises(ReadRoleError, match="writes the views"):
            grant_read_role(admin, read_role.schema, str(admin.info.user))
        super_role = f"tributary_test_super_{unique}"  # roles are the whole server's
        admin.execute(sql.SQL("CREATE ROLE {} SUPERUSER").format(sql.Identifier(super_role)))
        try:
            with pytest.raises(ReadRoleError, match="SUPERUSER"):
                grant_read_role(admin, read_role.schema, super_role)
        finally:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(super_role)))


def test_cli_grants_the_role_with_a_password_from_stdin(
    stack: Endpoints, read_role: ReadRole, unique: str
) -> None:
    role = f"nobody_{unique}"  # dropped by the fixture
    env = {
        **settings_env(stack.settings),
        "TRIBUTARY_POSTGRES_URL": stack.database_url,
        "TRIBUTARY_VIEWS_SCHEMA": read_role.schema,
    }
    done = subprocess.run(
        [sys.executable, "-m", "infra.cli", "grant-read-role", role, "--password-stdin"],
        input="cli-Secret-1\n",
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "TRIBUTARY_VIEWS_READ_URL" in done.stdout and "cli-Secret-1" not in done.stdout
    view = timeline(stack, read_role, unique, role_dsn(stack.postgres_dsn, role, "cli-Secret-1"))
    first_batch(view, view.store.live_generation(), "first")
    assert [p["text"] for p in view.queries[0].run(user_id=1)] == ["first"]
