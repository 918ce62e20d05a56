"""The three views end to end on real parts: commands through the command bus and users
through plain SQL into PostgreSQL, the real Debezium connector, Kafka, the view jobs run by
`tributary run views` (killed with kill -9 mid-batch and restarted), compared with a reference
computed from the source of truth (the event store and the users table); then the HTTP API
with read-your-writes on the live views.

Each test runs in a database of its own (same table names as production, own topic prefixes,
own Redis database), so nothing it does meets another test's data.
"""

import threading

import psycopg
import pytest
from fastapi.testclient import TestClient

from examples.social.views.reference import (
    expected_profiles,
    expected_search,
    expected_timelines,
)
from infra.http_api import create_app
from infra.polling import Deadline, poll_until
from infra.views import views_config
from spark_streaming.views import configured_views
from tests.integration.social.world import Workload, World, source_of_truth

#: Every wait of the kill -9 test draws on one budget, below the test's own timeout, so a wait
#: that runs out fails with its own message instead of the timeout's stack dump.
TEST_TIMEOUT_S = 420
BUDGET_S = TEST_TIMEOUT_S - 30


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_views_follow_the_source_of_truth_through_a_kill_9(world: World) -> None:
    budget = Deadline(BUDGET_S)
    views = list(configured_views(views_config(world.settings)).values())
    by_name = {v.name: v for v in views}
    world.cdc.start()
    world.cdc.wait_running()
    world.views.start()
    workload = Workload(world.settings)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(2200):
                workload.step()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    writer = threading.Thread(target=run)
    writer.start()

    def first_batches() -> bool:
        assert world.views.alive(), world.views.output()
        timeline = by_name["timeline"].store
        return timeline.committed(timeline.live_generation()).batches > 3

    poll_until(first_batches, budget.left(240), "the views' first batches", 1)
    world.views.kill9()  # mid-workload, the three queries most likely inside batches
    world.views.start()
    writer.join(budget.left(240))
    assert not writer.is_alive(), f"the workload did not finish ({workload.done} of 2200 steps)"
    assert not errors, errors
    assert workload.accepted > 800

    def converged() -> bool:
        assert world.views.alive(), world.views.output()  # ends the wait at once
        truth = source_of_truth(world.dsn)
        profiles = {int(e.key): dict(e.fields) for e in by_name["profile"].store.scan("profiles")}
        keep = ("text", "hashtags", "author_handle", "author_name")
        docs = {
            int(e.key): {k: e.fields.get(k) for k in keep}
            for e in by_name["search"].store.scan("posts")
        }
        with psycopg.connect(world.dsn) as conn:
            rows = conn.execute(
                "SELECT user_id, post_id FROM views.timeline"
                " ORDER BY user_id, created_at DESC, post_id DESC"
            ).fetchall()
        timelines: dict[int, list[int]] = {}
        for user_id, post_id in rows:
            timelines.setdefault(int(user_id), []).append(int(post_id))
        return (
            profiles == expected_profiles(truth)
            and docs == expected_search(truth)
            and timelines == expected_timelines(truth)
        )

    poll_until(converged, budget.left(240), "the views to equal the source of truth", 1)

    # The HTTP API on the live views: a command, then reads that wait for it (min_position).
    app = create_app(world.settings, views=views)
    with TestClient(app) as client:
        truth = source_of_truth(world.dsn)
        author = sorted(truth.users)[0]
        follower = next((a for a, b in truth.follows if b == author), None)
        done = client.post(
            "/commands",
            json={
                "type": "CreatePost",
                "data": {"post_id": 10**6, "author_id": author, "text": "zqxyz #http"},
            },
        )
        assert done.status_code == 200 and done.json()["status"] == "accepted"
        token = done.json()["position_token"]
        hits = client.get(
            "/search", params={"q": "zqxyz", "min_position": token, "timeout": budget.left(60)}
        )
        assert hits.status_code == 200 and [h["post_id"] for h in hits.json()] == [10**6]
        assert hits.json()[0]["author_handle"] == truth.users[author]["handle"]
        profile = client.get(
            f"/profile/{author}", params={"min_position": token, "timeout": budget.left(60)}
        )
        assert profile.json()["posts"] == expected_profiles(truth)[author]["posts"] + 1
        if follower is not None:
            timeline = client.get(
                f"/timeline/{follower}", params={"min_position": token, "timeout": budget.left(60)}
            )
            assert timeline.json()[0]["post_id"] == 10**6
        bad = client.post("/commands", json={"type": "CreatePost", "data": {"post_id": "x"}})
        assert bad.status_code == 422
        assert client.get("/health").status_code == 200
