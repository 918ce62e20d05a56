"""The events table is append-only in the database itself, whoever connects."""

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from event_store import NewEvent
from event_store.schema import APPEND_ONLY_SQLSTATE
from tests.integration.event_store.conftest import StoreEnv


def _sqlstate(exc: DBAPIError) -> str | None:
    orig = exc.orig
    return orig.sqlstate if isinstance(orig, psycopg.Error) else None


@pytest.fixture
def stored(env: StoreEnv) -> StoreEnv:
    env.store.append("acct-1", [NewEvent("Opened", {"n": 1})], 0, stream_type="acct")
    return env


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE {s}.events SET data = '{{}}'::jsonb",
        "DELETE FROM {s}.events",
        "TRUNCATE {s}.events",
    ],
)
def test_application_role_cannot_change_or_remove_events(stored: StoreEnv, statement: str) -> None:
    with pytest.raises(DBAPIError) as caught, stored.app.begin() as conn:
        conn.execute(text(statement.format(s=stored.schema)))
    assert _sqlstate(caught.value) == "42501"  # insufficient_privilege
    assert stored.count_events() == 1


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE {s}.events SET data = '{{}}'::jsonb",
        "DELETE FROM {s}.events",
        "TRUNCATE {s}.events",
    ],
)
def test_trigger_rejects_changes_even_for_the_owner(stored: StoreEnv, statement: str) -> None:
    with pytest.raises(DBAPIError) as caught, stored.admin.begin() as conn:
        conn.execute(text(statement.format(s=stored.schema)))
    assert _sqlstate(caught.value) == APPEND_ONLY_SQLSTATE
    assert "append-only" in str(caught.value)
    assert stored.count_events() == 1


def test_application_role_can_append_and_read(stored: StoreEnv) -> None:
    stored.store.append("acct-1", [NewEvent("Credited", {"n": 2})], 1, stream_type="acct")
    assert [e.event_type for e in stored.store.read_stream("acct-1")] == ["Opened", "Credited"]
