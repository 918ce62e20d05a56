"""The three views end to end on real parts: commands through the command bus and users
through plain SQL into PostgreSQL, the real Debezium connector, Kafka, the view jobs run by
`tributary run views` (killed with kill -9 mid-batch and restarted), compared with a reference
computed from the source of truth (the event store and the users table); then the HTTP API
with read-your-writes on the live views.

Each test runs in a database of its own (same table names as production, own topic prefixes,
own Redis database), so nothing it does meets another test's data.
"""

import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.engine import make_url

from cdc.slots import drop_publication, drop_slot
from connectors.postgres import PostgresConfig, make_engine
from event_store import Accepted, create_schema
from examples.social import prepare_database, upsert_user, users_table
from examples.social.views.reference import (
    SocialState,
    expected_profiles,
    expected_search,
    expected_timelines,
)
from infra.commands import command_bus, load_registry, register_schemas
from infra.http_api import create_app
from infra.polling import Deadline, poll_until
from infra.settings import Settings, load_settings
from infra.views import views_config
from spark_streaming.views import configured_views
from tests.integration.cdc_process import CdcProcess
from tests.integration.conftest import Endpoints
from tests.integration.pipeline.views_process import ViewsProcess

REDIS_DB = 7


@dataclass
class World:
    """One test's database, settings (as the CLI processes see them) and processes."""

    settings: Settings
    env: dict[str, str]
    dsn: str
    cdc: CdcProcess
    views: ViewsProcess


@pytest.fixture
def world(stack: Endpoints, unique: str, tmp_path: Path) -> Iterator[World]:
    database = f"social_{unique}"
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")  # type: ignore[arg-type]
    url = make_url(stack.database_url).set(database=database).render_as_string(False)
    redis_url = stack.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    settings_values = {
        "postgres_url": url,
        "kafka_bootstrap_servers": stack.bootstrap_servers,
        "redis_url": redis_url,
        "cdc_topic_prefix": f"cdc_{unique}",
        "event_topic_prefix": f"ev_{unique}.",
        "cdc_connector_name": f"s{unique}",
        "mirror_tables": "",
        "views": "examples.social.views:social_views",
        "home": tmp_path / "home",
        "view_trigger_interval_s": 0.5,
        "view_max_offsets_per_trigger": 400,
        "schema_registry_url": stack.settings.registry_url,
    }
    settings = load_settings(**settings_values)
    env = {f"{k.upper()}": str(v) for k, v in settings_values.items()}
    engine = make_engine(settings.postgres())
    with engine.begin() as conn:
        prepare_database(conn)
        create_schema(conn, settings.event_store_schema)
    engine.dispose()
    cdc = CdcProcess(
        stack,
        tmp_path / "cdc",
        f"s{unique}",
        ["public.users", "event_store.events"],
        postgres_url=url,
        cdc_topic_prefix=f"cdc_{unique}",
        event_topic_prefix=f"ev_{unique}.",
    )
    views = ViewsProcess(stack, tmp_path / "views", **env)
    yield World(settings, env, PostgresConfig(url).dsn, cdc, views)
    views.stop()
    cdc.stop()
    db = PostgresConfig(url)
    drop_slot(db, f"tributary_s{unique}")
    drop_publication(db, f"tributary_s{unique}")
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")  # type: ignore[arg-type]


class Workload:
    """Users by SQL (the CRUD table), posts and follows by commands through the bus."""

    def __init__(self, settings: Settings, seed: int = 9) -> None:
        registry, _ = load_registry(settings.command_handlers)
        register_schemas(settings, registry)  # as the command processor does at start
        self.engine = make_engine(settings.postgres())
        self.bus = command_bus(settings, self.engine, registry)
        self.rng = random.Random(seed)
        self.users: set[int] = set()
        self.posts: set[int] = set()
        self.follows: set[tuple[int, int]] = set()
        self.next_post = 1
        self.done = 0
        self.accepted = 0

    def user(self, user_id: int, name: str) -> None:
        with self.engine.begin() as conn:
            upsert_user(conn, users_table(), user_id, f"h{user_id}", name, "bio")
        self.users.add(user_id)

    def delete_user(self, user_id: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(text("DELETE FROM public.users WHERE id = :id"), {"id": user_id})
        self.users.discard(user_id)

    def send(self, command: str, data: dict[str, Any]) -> Accepted | None:
        result = self.bus.send(self.bus.registry.decode(command, data))
        if isinstance(result, Accepted):
            self.accepted += 1
            return result
        return None

    def step(self) -> None:
        r, roll = self.rng, self.rng.random()
        ids = sorted(self.users)
        if len(ids) < 6 or roll < 0.05:
            user_id = r.randrange(1, 40)
            self.user(user_id, f"User {user_id}")
        elif roll < 0.09:
            user_id = r.choice(ids)
            self.user(user_id, f"Renamed {r.randrange(10**6)}")
        elif roll < 0.10 and len(ids) > 10:
            self.delete_user(r.choice(ids))
        elif roll < 0.45:
            post_id, self.next_post = self.next_post, self.next_post + 1
            words = r.sample(["kafka", "spark", "stream", "join", "window", "ledger"], 2)
            text_ = f"{' '.join(words)} #{r.choice(words)} p{post_id}"
            if self.send(
                "CreatePost", {"post_id": post_id, "author_id": r.choice(ids), "text": text_}
            ):
                self.posts.add(post_id)
        elif roll < 0.55 and self.posts:
            self.send(
                "EditPost",
                {"post_id": r.choice(sorted(self.posts)), "text": f"edit #{r.randrange(9)}"},
            )
        elif roll < 0.62 and self.posts:
            post_id = r.choice(sorted(self.posts))
            if self.send("DeletePost", {"post_id": post_id}):
                self.posts.discard(post_id)
        elif roll < 0.88:
            a, b = r.sample(ids, 2)
            if (a, b) not in self.follows and self.send(
                "FollowUser", {"follower_id": a, "followee_id": b}
            ):
                self.follows.add((a, b))
        elif self.follows:
            a, b = r.choice(sorted(self.follows))
            if self.send("UnfollowUser", {"follower_id": a, "followee_id": b}):
                self.follows.discard((a, b))
        self.done += 1


def source_of_truth(dsn: str, schema: str = "event_store") -> SocialState:
    """Users from the CRUD table; live posts and follow edges folded from the event store."""
    state = SocialState()
    with psycopg.connect(dsn) as conn:
        for user_id, handle, name, bio in conn.execute(
            "SELECT id, handle, display_name, bio FROM public.users"
        ).fetchall():
            state.users[int(user_id)] = {"handle": handle, "display_name": name, "bio": bio}
        events = conn.execute(
            f"SELECT stream_id, event_type, data FROM {schema}.events ORDER BY stream_id, version"
        ).fetchall()
    for _stream, event_type, data in events:
        if event_type in ("PostCreated", "PostEdited"):
            state.posts[int(data["post_id"])] = {**data, "edited_at": data.get("edited_at")}
        elif event_type == "PostDeleted":
            state.posts.pop(int(data["post_id"]), None)
        elif event_type == "UserFollowed":
            state.follows.add((int(data["follower_id"]), int(data["followee_id"])))
        elif event_type == "UserUnfollowed":
            state.follows.discard((int(data["follower_id"]), int(data["followee_id"])))
    return state


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
