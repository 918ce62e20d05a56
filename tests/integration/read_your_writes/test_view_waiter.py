"""The waiter against PostgreSQL view stores advanced by hand (no Spark): a view has applied a
token once its store's offset passes the offset where CDC published the stream's event."""

import threading
import time

import pytest

from tests.integration.conftest import Endpoints
from tests.integration.event_store.conftest import StoreEnv
from tests.integration.read_your_writes.helpers import advance, hand_view, publish
from tributary.view_model import Batch
from views.read_your_writes import PositionToken, ViewsLaggingError, ViewWaiter

POSTS = ("events.post",)


def test_a_view_lags_until_its_store_passes_the_events_offset(
    stack: Endpoints, env: StoreEnv, views_schema: str
) -> None:
    timeline = hand_view(stack.postgres_dsn, views_schema, "timeline", POSTS)
    token = PositionToken("post", "post-1", 2)
    with ViewWaiter([timeline], stack.postgres_dsn, env.schema) as waiter:
        assert waiter.lagging(token) == ["timeline"]  # nothing published yet
        publish(stack.postgres_dsn, env.schema, "post-1", 1, 4)
        assert waiter.lagging(str(token)) == ["timeline"]  # version 2 is not on Kafka yet
        publish(stack.postgres_dsn, env.schema, "post-1", 2, 5)
        advance(timeline, {"events.post": {"0": 3}}, 0)
        assert waiter.lagging(token) == ["timeline"]
        advance(timeline, {"events.post": {"0": 5, "1": 90}}, 1)  # offset 5 is still ahead
        assert waiter.lagging(token) == ["timeline"]
        advance(timeline, {"events.post": {"0": 6}}, 2)
        assert waiter.lagging(token) == []
        waiter.wait(token, timeout=0)
        assert waiter.lagging(PositionToken("post", "post-1", 1)) == []  # an older write too


def test_the_partition_of_the_event_is_the_one_that_counts(
    stack: Endpoints, env: StoreEnv, views_schema: str
) -> None:
    timeline = hand_view(stack.postgres_dsn, views_schema, "timeline", POSTS)
    publish(stack.postgres_dsn, env.schema, "post-2", 1, 7, partition=1)
    advance(timeline, {"events.post": {"0": 500}}, 0)
    with ViewWaiter([timeline], stack.postgres_dsn, env.schema) as waiter:
        assert waiter.lagging("post/post-2@1") == ["timeline"]
        advance(timeline, {"events.post": {"1": 8}}, 1)
        assert waiter.lagging("post/post-2@1") == []


def test_views_that_do_not_read_the_topic_are_never_waited_for(
    stack: Endpoints, env: StoreEnv, views_schema: str
) -> None:
    timeline = hand_view(stack.postgres_dsn, views_schema, "timeline", POSTS)
    graph = hand_view(stack.postgres_dsn, views_schema, "graph", ("events.follows",))
    mirror = hand_view(stack.postgres_dsn, views_schema, "mirror", ("cdc.public.users",))
    publish(stack.postgres_dsn, env.schema, "post-3", 1, 0)
    with ViewWaiter([timeline, graph, mirror], stack.postgres_dsn, env.schema) as waiter:
        assert [v.name for v in waiter.readers("post/post-3@1")] == ["timeline"]
        assert waiter.lagging("post/post-3@1") == ["timeline"]  # graph and mirror never ran
        advance(timeline, {"events.post": {"0": 1}}, 0)
        assert waiter.lagging("post/post-3@1") == []
        started = time.monotonic()
        waiter.wait("post/post-3@1", timeout=5)
        waiter.wait("likes/like-1@4", timeout=5)  # no view reads events.likes: nothing to wait
        assert time.monotonic() - started < 1


def test_a_timeout_names_the_lagging_view_and_a_late_catch_up_ends_the_wait(
    stack: Endpoints, env: StoreEnv, views_schema: str
) -> None:
    fast = hand_view(stack.postgres_dsn, views_schema, "fast", POSTS)
    slow = hand_view(stack.postgres_dsn, views_schema, "slow", POSTS)
    publish(stack.postgres_dsn, env.schema, "post-4", 3, 41)
    advance(fast, {"events.post": {"0": 42}}, 0)
    advance(slow, {"events.post": {"0": 40}}, 0)
    with ViewWaiter([fast, slow], stack.postgres_dsn, env.schema) as waiter:
        started = time.monotonic()
        with pytest.raises(ViewsLaggingError) as caught:
            waiter.wait("post/post-4@3", timeout=1.0)
        assert 1.0 <= time.monotonic() - started < 5
        assert caught.value.views == ["slow"]
        assert caught.value.token == "post/post-4@3"
        assert "slow" in str(caught.value) and "fast" not in str(caught.value)
        assert "events.post[0]@41" in caught.value.lagging["slow"]
        assert "reached offset 40" in caught.value.lagging["slow"]

        catch_up = threading.Timer(0.5, advance, (slow, {"events.post": {"0": 45}}, 1))
        catch_up.start()
        started = time.monotonic()
        waiter.wait("post/post-4@3", timeout=20)
        assert 0.4 < time.monotonic() - started < 5
        catch_up.join()


def test_a_store_that_cannot_be_reached_counts_as_lagging_with_the_reason(
    stack: Endpoints, env: StoreEnv, views_schema: str
) -> None:
    dead_dsn = "postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=2"
    gone = hand_view(dead_dsn, views_schema, "gone", POSTS)
    publish(stack.postgres_dsn, env.schema, "post-5", 1, 0)
    with ViewWaiter([gone], stack.postgres_dsn, env.schema) as waiter:
        assert waiter.lagging("post/post-5@1") == ["gone"]
        with pytest.raises(ViewsLaggingError, match="gone: its store cannot be reached"):
            waiter.wait("post/post-5@1", timeout=0.2)


def test_a_replay_swapped_in_is_followed(
    stack: Endpoints, env: StoreEnv, views_schema: str
) -> None:
    timeline = hand_view(stack.postgres_dsn, views_schema, "timeline", POSTS)
    publish(stack.postgres_dsn, env.schema, "post-6", 1, 9)
    advance(timeline, {"events.post": {"0": 5}}, 0)
    with ViewWaiter([timeline], stack.postgres_dsn, env.schema, generation_ttl_s=0.2) as waiter:
        assert waiter.lagging("post/post-6@1") == ["timeline"]  # the live generation is cached
        store = timeline.store
        shadow = "grebuild01"
        store.prepare(shadow)
        writer = store.writer(shadow, live=False)
        writer.apply(Batch(0, {"events.post": {"0": 12}}))
        writer.close()
        store.swap_in(shadow)
        waiter.wait("post/post-6@1", timeout=10)


def test_many_waits_run_at_once(stack: Endpoints, env: StoreEnv, views_schema: str) -> None:
    timeline = hand_view(stack.postgres_dsn, views_schema, "timeline", POSTS)
    for n in range(16):
        publish(stack.postgres_dsn, env.schema, f"post-{100 + n}", 1, n)
    errors: list[BaseException] = []
    done = [threading.Event() for _ in range(16)]
    with ViewWaiter([timeline], stack.postgres_dsn, env.schema, pool_size=2) as waiter:

        def wait(n: int) -> None:
            try:
                waiter.wait(f"post/post-{100 + n}@1", timeout=30)
                done[n].set()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=wait, args=(n,)) for n in range(16)]
        for thread in threads:
            thread.start()
        time.sleep(0.3)  # time for a wrong early return to show
        assert not any(d.is_set() for d in done)  # none applied yet
        advance(timeline, {"events.post": {"0": 8}}, 0)
        for n in range(8):  # offsets 0..7 are applied: those waits end
            assert done[n].wait(10), f"the wait for offset {n} did not end"
        assert not any(d.is_set() for d in done[8:])  # offsets 8..15 still ahead
        advance(timeline, {"events.post": {"0": 16}}, 1)
        for thread in threads:
            thread.join(30)
    assert errors == []
    assert all(d.is_set() for d in done)
