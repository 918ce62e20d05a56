"""The command bus over the social domain: idempotency, rejections, upcasting, snapshots."""

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from event_store import (
    Accepted,
    CommandBus,
    CommandDecodeError,
    NewEvent,
    Rejected,
    UnknownCommandTypeError,
)
from examples.social import (
    CreatePost,
    DeletePost,
    EditPost,
    FollowUser,
    Post,
    PostCreated,
    UnfollowUser,
)
from examples.social.follows import Following
from tests.integration.event_store.conftest import StoreEnv, plain_text


def test_a_retried_command_id_appends_nothing_and_returns_the_first_result(
    env: StoreEnv,
) -> None:
    bus = env.bus()
    first = bus.send(CreatePost(1, 1, "hello #there"), command_id="cmd-1")
    assert isinstance(first, Accepted) and first.version == 1
    again = bus.send(CreatePost(1, 1, "hello #there"), command_id="cmd-1")
    other_body = bus.send(EditPost(1, "different"), command_id="cmd-1")
    assert again == first and other_body == first
    assert env.count_events() == 1

    rejected = bus.send(CreatePost(2, 99, "nobody wrote this"), command_id="cmd-2")
    assert isinstance(rejected, Rejected)
    with env.admin.begin() as conn:  # the author appears afterwards: the first answer stands
        conn.execute(text(f"INSERT INTO {env.users.schema}.users (id, handle) VALUES (99, 'z')"))
    assert bus.send(CreatePost(2, 99, "nobody wrote this"), command_id="cmd-2") == rejected
    assert env.count_events() == 1


def test_concurrent_twins_of_one_command_id_store_once(env: StoreEnv) -> None:
    import threading

    bus = env.bus()
    results: list[Any] = []
    barrier = threading.Barrier(8)

    def send() -> None:
        barrier.wait()
        results.append(bus.send(CreatePost(7, 1, "twin"), command_id="twin-id"))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(r == results[0] for r in results)
    assert isinstance(results[0], Accepted)
    assert env.count_events() == 1


@pytest.mark.parametrize(
    ("setup", "command", "reason"),
    [
        ([], CreatePost(1, 42, "hi"), "unknown author"),
        ([], CreatePost(1, 1, ""), "empty"),
        ([], CreatePost(1, 1, "   \n"), "empty"),
        ([], CreatePost(1, 1, "x" * 501), "limit is 500"),
        ([CreatePost(1, 1, "a")], CreatePost(1, 2, "b"), "already exists"),
        ([], EditPost(1, "new"), "does not exist"),
        ([], DeletePost(1), "does not exist"),
        ([CreatePost(1, 1, "a")], EditPost(1, ""), "empty"),
        ([CreatePost(1, 1, "a"), DeletePost(1)], EditPost(1, "b"), "deleted"),
        ([CreatePost(1, 1, "a"), DeletePost(1)], DeletePost(1), "deleted"),
        ([], FollowUser(1, 1), "themselves"),
        ([FollowUser(1, 2)], FollowUser(1, 2), "already follows"),
        ([], UnfollowUser(1, 2), "does not follow"),
        ([FollowUser(1, 2), UnfollowUser(1, 2)], UnfollowUser(1, 2), "does not follow"),
        ([], FollowUser(1, 77), "unknown followee"),
    ],
)
def test_invalid_commands_are_rejected_with_a_reason_and_append_nothing(
    env: StoreEnv, setup: list[Any], command: Any, reason: str
) -> None:
    bus = env.bus()
    for earlier in setup:
        assert isinstance(bus.send(earlier), Accepted)
    before = env.count_events()
    result = bus.send(command)
    assert isinstance(result, Rejected)
    assert reason in result.reason
    assert env.count_events() == before


def test_valid_lifecycle_carries_hashtags_and_creation_time(env: StoreEnv) -> None:
    bus = env.bus()
    created = bus.send(CreatePost(5, 1, "Hello #World and #python #world"))
    edited = bus.send(EditPost(5, "now #Rust"))
    deleted = bus.send(DeletePost(5))
    assert [type(r) for r in (created, edited, deleted)] == [Accepted] * 3
    events = env.store.read_stream("post-5")
    assert [e.event_type for e in events] == ["PostCreated", "PostEdited", "PostDeleted"]
    assert [e.data["hashtags"] for e in events] == [["world", "python"], ["rust"], ["rust"]]
    created_at = events[0].data["created_at"]
    assert all(e.data["created_at"] == created_at for e in events)
    assert [e.metadata["command_type"] for e in events] == ["CreatePost", "EditPost", "DeletePost"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)
COMMAND_FIELDS = ["post_id", "author_id", "text", "follower_id", "followee_id"]
invalid_data = st.dictionaries(st.sampled_from(COMMAND_FIELDS) | st.text(max_size=6), json_values)


@pytest.fixture
def bus(env: StoreEnv) -> CommandBus:
    """One bus for all the examples of a property test: building one looks up (or registers)
    every event schema in the registry, which cost more than the examples themselves."""
    return env.bus()


command_types = st.sampled_from(
    ["CreatePost", "EditPost", "DeletePost", "FollowUser", "UnfollowUser", "Nope", ""]
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(command_type=command_types, data=invalid_data | json_values)
def test_generated_commands_are_decoded_or_refused_and_refusals_append_nothing(
    env: StoreEnv, bus: CommandBus, command_type: str, data: Any
) -> None:
    before = env.count_events()
    try:
        command = bus.registry.decode(command_type, data)
    except (CommandDecodeError, UnknownCommandTypeError) as exc:
        assert str(exc)
        assert env.count_events() == before
        return
    result = bus.send(command, command_id=str(uuid.uuid4()))
    if isinstance(result, Rejected):
        assert result.reason
        assert env.count_events() == before
    else:
        assert env.count_events() == before + 1


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text_=st.one_of(
        st.just(""),
        st.text(st.sampled_from(" \t\n"), max_size=5),
        st.text(min_size=501, max_size=700),
    ),
    author=st.integers(min_value=5, max_value=2**62),
)
def test_generated_invalid_posts_are_rejected(
    env: StoreEnv, bus: CommandBus, text_: str, author: int
) -> None:
    before = env.count_events()
    for command in (CreatePost(1000, 1, text_), CreatePost(1001, author, "fine text")):
        result = bus.send(command)
        assert isinstance(result, Rejected) and result.reason
    assert env.count_events() == before


def test_upcaster_turns_a_stored_v1_event_into_v2_on_read(env: StoreEnv) -> None:
    legacy = NewEvent(
        "PostPublished",
        {
            "post_id": 9,
            "author_id": 1,
            "text": "old #Style",
            "published_at": "2020-01-02T03:04:05Z",
        },
        schema_version=1,
    )
    env.store.append("post-9", [legacy], 0, stream_type="post")
    bus = env.bus()
    [stored] = env.store.read_stream("post-9")
    assert (stored.event_type, stored.schema_version) == ("PostPublished", 1)  # history untouched
    event = bus.registry.codec.decode(stored)
    assert isinstance(event, PostCreated) and event.schema_version == 2
    assert event.hashtags == ("style",)
    assert event.created_at.year == 2020
    # And the aggregate folds it: the renamed, reshaped event counts as a created post.
    assert isinstance(bus.send(EditPost(9, "new #text")), Accepted)


def test_a_snapshot_loaded_aggregate_equals_a_replayed_one(env: StoreEnv) -> None:
    bus = env.bus(snapshot_every=4)
    assert isinstance(bus.send(CreatePost(3, 1, "v1 #a")), Accepted)
    for i in range(9):
        assert isinstance(bus.send(EditPost(3, f"v{i + 2} #t{i}")), Accepted)
    for followee in (2, 3, 4):
        bus.send(FollowUser(1, followee))
    bus.send(UnfollowUser(1, 3))
    with env.admin.connect() as conn:
        snaps = dict(
            conn.execute(text(f"SELECT stream_id, version FROM {env.schema}.snapshots")).all()
        )
    assert snaps == {"post-3": 8, "follows-1": 4}
    for aggregate_type, stream in ((Post, "post-3"), (Following, "follows-1")):
        loaded = bus.load(aggregate_type, stream)
        replayed = bus.replay(aggregate_type, stream)
        assert loaded.version == replayed.version
        assert loaded.state == replayed.state
    post = bus.load(Post, "post-3").state
    assert plain_text(env.admin, env.schema, post.author_id, post.text) == "v10 #t8"
    assert bus.load(Following, "follows-1").state.followees == frozenset({2, 4})


def test_loads_really_start_from_the_snapshot_unless_its_shape_is_outdated(env: StoreEnv) -> None:
    bus = env.bus(snapshot_every=2)
    bus.send(CreatePost(4, 1, "first"))
    bus.send(EditPost(4, "second"))
    bus.send(EditPost(4, "third"))
    with env.admin.begin() as conn:  # snapshots are a cache, so they are not append-only
        conn.execute(
            text(
                f"UPDATE {env.schema}.snapshots SET state = jsonb_set(state, '{{author_id}}', '99')"
            )
        )
    assert bus.load(Post, "post-4").state.author_id == 99  # came from the snapshot
    third = bus.load(Post, "post-4").state.text  # plus the event after it
    assert plain_text(env.admin, env.schema, 1, third) == "third"
    assert bus.replay(Post, "post-4").state.author_id == 1

    class PostV2(Post):
        snapshot_version = Post.snapshot_version + 1  # a shape the stored snapshot is not

    assert bus.load(PostV2, "post-4").state == bus.replay(Post, "post-4").state
