"""Appends, stream reads and optimistic concurrency against the real PostgreSQL."""

import pytest

from event_store import ConcurrencyError, NewEvent
from tests.integration.event_store.conftest import StoreEnv


def _events(n: int, start: int = 0) -> list[NewEvent]:
    return [NewEvent("Counted", {"n": i}) for i in range(start, start + n)]


def test_append_assigns_consecutive_versions_and_reads_back(env: StoreEnv) -> None:
    first = env.store.append("c-1", _events(3), 0, stream_type="counter")
    second = env.store.append("c-1", _events(2, 3), 3, stream_type="counter")
    assert (first.version, second.version) == (3, 5)
    events = env.store.read_stream("c-1")
    assert [e.version for e in events] == [1, 2, 3, 4, 5]
    assert [e.data["n"] for e in events] == [0, 1, 2, 3, 4]
    assert [str(e.event_id) for e in events] == [*first.event_ids, *second.event_ids]
    assert [e.position for e in events] == [*first.positions, *second.positions]
    assert {e.stream_type for e in events} == {"counter"}
    assert [e.version for e in env.store.read_stream("c-1", from_version=4)] == [4, 5]
    assert env.store.stream_version("c-1") == 5


@pytest.mark.parametrize("expected", [0, 1, 2, 4, 10])
def test_wrong_expected_version_raises_and_stores_nothing(env: StoreEnv, expected: int) -> None:
    env.store.append("c-1", _events(3), 0, stream_type="counter")
    with pytest.raises(ConcurrencyError) as caught:
        env.store.append("c-1", _events(2), expected, stream_type="counter")
    assert caught.value.expected_version == expected
    assert env.store.stream_version("c-1") == 3
    assert env.count_events() == 3


def test_a_failed_multi_event_append_stores_none_of_its_events(env: StoreEnv) -> None:
    env.store.append("c-1", _events(1), 0, stream_type="counter")
    with pytest.raises(ConcurrencyError):
        env.store.append("c-1", _events(50), 0, stream_type="counter")
    assert env.count_events() == 1


def test_empty_append_is_a_no_op(env: StoreEnv) -> None:
    result = env.store.append("c-1", [], 0, stream_type="counter")
    assert result.version == 0 and result.position is None
    assert env.count_events() == 0


def test_a_missing_schema_says_how_to_create_it(env: StoreEnv, unique: str) -> None:
    from event_store import EventStore
    from event_store.errors import SchemaMissingError

    store = EventStore(env.admin, f"nowhere_{unique}")
    with pytest.raises(SchemaMissingError, match="create_schema") as caught:
        store.append("c-1", _events(1), 0, stream_type="counter")
    assert caught.value.sqlstate == "42P01"
