"""One test's world for the social pipeline tests: a database of its own (production table
names, own topic prefixes, own Redis database), its settings and processes, a workload of users
by SQL and commands through the bus, and the source of truth to compare the views with."""

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
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
from examples.social.views.reference import source_of_truth as reference_truth
from infra.commands import command_bus, load_registry, register_schemas
from infra.settings import Settings, load_settings
from projections.view import View
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
        **stack.kafka_settings,
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
    """Users from the CRUD table; live posts and follow edges folded from the event store
    (text decrypted, forgotten users taken out: the reference's own reading)."""
    return reference_truth(dsn, schema)


def views_equal_the_truth(views: Mapping[str, View], dsn: str) -> bool:
    """Whether the search index, the profile cache and the timeline table each equal what the
    reference computes from the source of truth now."""
    truth = source_of_truth(dsn)
    profiles = {int(e.key): dict(e.fields) for e in views["profile"].store.scan("profiles")}
    keep = ("text", "hashtags", "author_handle", "author_name")
    docs = {
        int(e.key): {k: e.fields.get(k) for k in keep} for e in views["search"].store.scan("posts")
    }
    with psycopg.connect(dsn) as conn:
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
