"""Per-test event store: its own schema, its own application role, the demo's users table.

Everything is created under names with the test's unique suffix, so tests running at the
same time in the same database never collide; the superuser creates and drops, the tests
read and write as the application role (SELECT/INSERT on events, no UPDATE/DELETE).
"""

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine, Table, create_engine, text
from sqlalchemy.engine import make_url

from connectors.postgres import PostgresConfig, make_engine
from connectors.schema_registry.client import RegistryClient
from event_store import (
    CommandBus,
    EventStore,
    SnapshotPolicy,
    create_schema,
    drop_schema,
    grant_application_role,
)
from examples.social import create_users_table, social_registry, upsert_user
from tests.integration.conftest import Endpoints

USERS = [(1, "ann"), (2, "bob"), (3, "cy"), (4, "dee")]


@dataclass
class StoreEnv:
    """One test's store: admin (superuser) and app (application role) engines."""

    schema: str
    role: str
    admin: Engine
    app: Engine
    store: EventStore
    users: Table
    registry_url: str

    def bus(self, snapshot_every: int = 100, max_retries: int = 5) -> CommandBus:
        """A bus of the social domain, its event schemas registered (typed events)."""
        registry = social_registry(self.users)
        client = RegistryClient(self.registry_url)
        registry.codec.register_schemas(client)
        client.close()
        return CommandBus(
            self.store,
            registry,
            SnapshotPolicy(snapshot_every),
            max_retries=max_retries,
        )

    def count_events(self) -> int:
        with self.admin.connect() as conn:
            return int(
                conn.execute(text(f"SELECT count(*) FROM {self.schema}.events")).scalar_one()
            )


def role_url(database_url: str, role: str) -> str:
    return make_url(database_url).set(username=role, password=role).render_as_string(False)


@pytest.fixture
def env(stack: Endpoints, unique: str) -> Iterator[StoreEnv]:
    schema, users_schema, role = f"es_{unique}", f"social_{unique}", f"es_app_{unique}"
    admin = make_engine(PostgresConfig(stack.database_url, pool_size=2))
    with admin.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN PASSWORD '{role}'"))
        create_schema(conn, schema)
        grant_application_role(conn, role, schema)
        users = create_users_table(conn, users_schema)
        for user_id, handle in USERS:
            upsert_user(conn, users, user_id, handle)
        conn.execute(text(f"GRANT USAGE ON SCHEMA {users_schema} TO {role}"))
        conn.execute(text(f"GRANT SELECT ON {users_schema}.users TO {role}"))
    app = create_engine(
        role_url(stack.database_url, role), pool_size=20, max_overflow=4, pool_pre_ping=True
    )
    try:
        yield StoreEnv(
            schema, role, admin, app, EventStore(app, schema), users, stack.settings.registry_url
        )
    finally:
        app.dispose()
        with admin.begin() as conn:
            drop_schema(conn, schema)
            drop_schema(conn, users_schema)
            conn.execute(text(f"DROP OWNED BY {role}"))
            conn.execute(text(f"DROP ROLE {role}"))
        admin.dispose()


def plain_text(engine: Engine, schema: str, author_id: int, token: str | bytes) -> str:
    """A post's text from its stored or published token (personal data, encrypted with the
    author's key in the store's key table); fails when the value is not a token."""
    from sqlalchemy import text

    from event_store.personal import decrypt

    assert (token.decode() if isinstance(token, bytes) else token).startswith("tx1:"), token
    subject = ("user", str(author_id))
    with engine.connect() as conn:
        key = conn.execute(
            text(
                f"SELECT key FROM {schema}.subject_keys WHERE subject_type = :t AND subject_id = :i"
            ),
            {"t": subject[0], "i": subject[1]},
        ).scalar_one()
    value = decrypt(bytes(key), token, subject, "text")
    assert isinstance(value, str)
    return value
