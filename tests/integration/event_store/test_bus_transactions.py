"""The command bus's transaction: cached states, pipelined commits, lost prepared statements.

A command is one transaction in two round trips (``BEGIN`` + load, writes + ``COMMIT``);
these tests hold the shortcuts to the guarantees: a cached state never hides another
writer's events, a write whose append stores nothing commits nothing else, and a
connection whose prepared statements were dropped recovers by itself.
"""

from typing import Any

import pytest
from sqlalchemy import create_engine, text

from event_store import (
    Accepted,
    CommandBus,
    ConcurrencyError,
    EventStore,
    Rejected,
    SnapshotPolicy,
)
from examples.social import CreatePost, EditPost, FollowUser, Post, social_registry
from tests.integration.event_store.conftest import StoreEnv, plain_text, role_url


def _count(env: StoreEnv, table: str) -> int:
    with env.admin.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {env.schema}.{table}")).scalar_one())


def test_a_cached_state_never_hides_what_another_writer_appended(env: StoreEnv) -> None:
    ours, theirs = env.bus(), env.bus()
    assert isinstance(ours.send(CreatePost(1, 1, "one")), Accepted)
    assert isinstance(ours.send(EditPost(1, "two")), Accepted)  # loaded: cached at version 1
    assert len(ours.states) == 1
    assert isinstance(theirs.send(EditPost(1, "three")), Accepted)  # behind our cache's back
    result = ours.send(EditPost(1, "four"))
    assert isinstance(result, Accepted) and result.version == 4  # no conflict, no gap
    assert ours.load(Post, "post-1").state == ours.replay(Post, "post-1").state
    assert plain_text(env.admin, env.schema, 1, ours.replay(Post, "post-1").state.text) == "four"
    assert ours.attempts == 3  # the cached state was extended, not retried


def test_states_are_cached_per_aggregate_type_and_evicted_oldest_first(env: StoreEnv) -> None:
    bus = CommandBus(env.store, social_registry(env.users), cache_size=2)
    for post in (1, 2, 3):
        bus.send(CreatePost(post, 1, "x"))
        bus.send(EditPost(post, "y"))
    assert len(bus.states) == 2
    assert bus.states.get(Post, "post-1") is None
    cached = bus.states.get(Post, "post-3")
    assert cached is not None and cached[0] == 1  # the state as loaded, before the edit
    bus.send(FollowUser(1, 2))
    bus.send(FollowUser(1, 3))
    assert bus.states.get(Post, "follows-1") is None  # another type: another key


def test_a_write_whose_append_stores_nothing_commits_nothing_else(
    env: StoreEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writes and COMMIT go in one pipeline: when the append's guard finds no head at
    the expected version (no row, no error), the record and the snapshot must not land."""
    bus = env.bus(snapshot_every=1, max_retries=2)
    assert isinstance(bus.send(CreatePost(5, 1, "first")), Accepted)
    before = (_count(env, "events"), _count(env, "commands"), _count(env, "snapshots"))
    real = bus._aggregate

    def claims_a_later_version(*args: Any) -> Any:
        aggregate = real(*args)
        aggregate.version += 3  # the guard looks for version 4, which does not exist
        return aggregate

    monkeypatch.setattr(bus, "_aggregate", claims_a_later_version)
    with pytest.raises(ConcurrencyError):
        bus.send(EditPost(5, "second"), command_id="ghost")
    assert (_count(env, "events"), _count(env, "commands"), _count(env, "snapshots")) == before
    assert bus.previous_result("ghost") is None
    assert bus.attempts == 1 + 3  # the first command, then three tries of this one


def test_a_connection_whose_prepared_statements_were_dropped_recovers(
    stack: Any, env: StoreEnv
) -> None:
    """psycopg runs DEALLOCATE ALL after a ROLLBACK of its own: the bus and the store
    prepare their statements again and the command goes through, once."""
    engine = create_engine(role_url(stack.database_url, env.role), pool_size=1, max_overflow=0)
    try:
        store = EventStore(engine, env.schema)
        bus = CommandBus(store, social_registry(env.users), SnapshotPolicy(100))
        assert isinstance(bus.send(CreatePost(8, 1, "a")), Accepted)
        with engine.connect() as conn:  # the pool's only connection
            conn.exec_driver_sql("DEALLOCATE ALL")
        assert isinstance(bus.send(EditPost(8, "b")), Accepted)
        with engine.connect() as conn:
            conn.exec_driver_sql("DEALLOCATE ALL")
        assert isinstance(bus.send(CreatePost(9, 1, "c")), Accepted)  # a new stream: no cache
        with engine.connect() as conn:
            conn.exec_driver_sql("DEALLOCATE ALL")
        from event_store import NewEvent

        store.append("x-1", [NewEvent("X", {})], 0, stream_type="x")
        assert [e.event_type for e in store.read_stream("x-1")] == ["X"]
        assert _count(env, "commands") == 3 and bus.attempts == 3
    finally:
        engine.dispose()


def test_an_append_whose_prepared_statement_was_dropped_runs_again_once(
    stack: Any, env: StoreEnv
) -> None:
    """An append whose statement this connection prepared before is sent on its own, outside
    a pipeline; when the server has forgotten it (DEALLOCATE ALL), it is prepared again and
    the events are stored once, one event or many."""
    from event_store import NewEvent

    engine = create_engine(role_url(stack.database_url, env.role), pool_size=1, max_overflow=0)
    try:
        store = EventStore(engine, env.schema)
        for version, count in enumerate((1, 1, 1, 2, 2, 2)):
            expected = sum((1, 1, 1, 2, 2, 2)[:version])
            if version in (2, 5):  # both statements were prepared on the pool's only connection
                with engine.connect() as conn:
                    conn.exec_driver_sql("DEALLOCATE ALL")
            batch = [NewEvent("Y", {"n": expected + k + 1}) for k in range(count)]
            assert store.append("y-1", batch, expected, stream_type="y").version == expected + count
        assert [e.data["n"] for e in store.read_stream("y-1")] == list(range(1, 10))
    finally:
        engine.dispose()


def test_rejections_and_repeats_end_their_transactions(env: StoreEnv) -> None:
    """A rejection is recorded, a repeat answered from the record; neither leaves a
    transaction open on the pooled connection (the next command would see it)."""
    bus = env.bus()
    rejected = bus.send(CreatePost(6, 42, "nobody"), command_id="r-1")
    assert bus.send(CreatePost(6, 42, "nobody"), command_id="r-1") == rejected
    with env.app.connect() as conn:
        status = conn.connection.driver_connection.pgconn.transaction_status
    assert status == 0  # idle
    assert isinstance(bus.send(CreatePost(6, 1, "somebody")), Accepted)
    assert _count(env, "commands") == 2 and _count(env, "events") == 1


def _key_of(env: StoreEnv, author_id: int) -> bytes | None:
    with env.admin.connect() as conn:
        key = conn.execute(
            text(
                f"SELECT key FROM {env.schema}.subject_keys"
                " WHERE subject_type = 'user' AND subject_id = :i"
            ),
            {"i": str(author_id)},
        ).scalar_one_or_none()
    return None if key is None else bytes(key)


def _stored_text(env: StoreEnv, post_id: int) -> str:
    with env.admin.connect() as conn:
        return str(
            conn.execute(
                text(
                    f"SELECT data->>'text' FROM {env.schema}.events"
                    " WHERE stream_id = :s AND version = 1"
                ),
                {"s": f"post-{post_id}"},
            ).scalar_one()
        )


def test_a_cached_key_never_writes_for_a_subject_forgotten_behind_its_back(env: StoreEnv) -> None:
    """The bus caches each subject's key (no round trip for it on the next command); a forget
    by anyone else makes the next write with that key fail its guard, and the command is run
    again: rejected as forgotten, nothing appended."""
    from event_store.forgetting import forget

    bus = env.bus()
    assert isinstance(bus.send(CreatePost(1, 1, "one")), Accepted)
    assert bus.keys.get(("user", "1")) == _key_of(env, 1)
    assert isinstance(bus.send(CreatePost(2, 1, "two")), Accepted)  # with the cached key
    assert plain_text(env.admin, env.schema, 1, _stored_text(env, 2)) == "two"
    events = _count(env, "events")

    forget(env.admin, env.schema, "user", "1")
    result = bus.send(CreatePost(3, 1, "three"))
    assert isinstance(result, Rejected) and "forgotten" in result.reason, result
    assert bus.keys.get(("user", "1")) is None
    assert _count(env, "events") == events + 1  # the forget's audit event only
    with env.admin.connect() as conn:
        posts = conn.execute(
            text(f"SELECT count(*) FROM {env.schema}.events WHERE stream_id = 'post-3'")
        ).scalar_one()
    assert posts == 0


def test_a_cached_key_that_is_no_longer_the_subjects_is_replaced_or_stored(env: StoreEnv) -> None:
    """A subject whose key changed since the bus cached it (another writer's key won): the
    write is run again with the key the table holds. A subject with no key row (a key cached
    from a transaction that rolled back): the cached key is stored with what it encrypted."""
    bus = env.bus()
    assert isinstance(bus.send(CreatePost(1, 1, "one")), Accepted)
    assert isinstance(bus.send(CreatePost(2, 2, "two")), Accepted)
    other = bytes(range(32))
    with env.admin.begin() as conn:
        conn.execute(
            text(f"UPDATE {env.schema}.subject_keys SET key = :k WHERE subject_id = '1'"),
            {"k": other},
        )
        conn.execute(text(f"DELETE FROM {env.schema}.subject_keys WHERE subject_id = '2'"))
    cached_2 = bus.keys.get(("user", "2"))

    assert isinstance(bus.send(CreatePost(3, 1, "three")), Accepted)
    assert _key_of(env, 1) == other and bus.keys.get(("user", "1")) == other
    assert plain_text(env.admin, env.schema, 1, _stored_text(env, 3)) == "three"

    assert isinstance(bus.send(CreatePost(4, 2, "four")), Accepted)
    assert _key_of(env, 2) == cached_2
    assert plain_text(env.admin, env.schema, 2, _stored_text(env, 4)) == "four"
