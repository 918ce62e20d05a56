"""The search index, profile cache and home timeline on real Spark, tantivy, Redis and
PostgreSQL, fed a generated workload in CDC's wire formats, compared with a reference computed
independently from the workload's model of the source of truth."""

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from event_store import create_schema
from event_store.personal import PgKeys
from examples.social.feed import SocialFeed
from examples.social.views import profile_view, search_view, timeline_view
from examples.social.views.reference import (
    expected_profiles,
    expected_search,
    expected_timelines,
    timelines_by_sql,
)
from projections.view import View
from spark_streaming.replay import replay
from spark_streaming.runner import ViewRunner
from spark_streaming.view_group import ViewGroupJob
from spark_streaming.view_job import BatchReport, ViewJob
from tests.integration.conftest import Endpoints
from tests.unit.projections.test_change_fuzz import poison_samples
from views.catalog import JobOptions
from views.dead_letters import REASON_HEADER, dlq_topic


@dataclass
class Social:
    feed: SocialFeed
    search: View
    profile: View
    timeline: View
    schema: str
    dsn: str
    options: JobOptions

    @property
    def views(self) -> list[View]:
        return [self.search, self.profile, self.timeline]


@pytest.fixture
def social(stack: Endpoints, unique: str, tmp_path: Path) -> Iterator[Social]:
    registry = stack.settings.registry_url
    schema = f"views_{unique}"
    keys_schema = f"keys_{unique}"  # the subject keys that encrypt the posts' text
    engine = create_engine(make_url(stack.database_url))
    with engine.begin() as conn:
        create_schema(conn, keys_schema)
    engine.dispose()
    key_conn = psycopg.connect(stack.postgres_dsn, autocommit=True)
    feed = SocialFeed(
        stack.kafka, f"t{unique}", registry_url=registry, keys=PgKeys(key_conn, keys_schema)
    )
    topics = feed.topics
    keys = (stack.postgres_dsn, keys_schema)
    yield Social(
        feed,
        search_view(
            tmp_path / "indexes",
            (topics["posts"], topics["users"]),
            f"search_{unique}",
            registry_url=registry,
            keys=keys,
        ),
        profile_view(
            stack.redis_url,
            (topics["users"], topics["follows"], topics["posts"]),
            f"profile_{unique}",
            f"t{unique}:profile:{{key}}",
            registry_url=registry,
            keys=keys,
        ),
        timeline_view(
            stack.postgres_dsn,
            schema,
            (topics["posts"], topics["follows"]),
            f"timeline_{unique}",
            registry_url=registry,
            keys=keys,
        ),
        schema,
        stack.postgres_dsn,
        JobOptions(checkpoint_root=tmp_path / "checkpoints", max_offsets_per_trigger=700),
    )
    feed.producer.flush(10)
    key_conn.close()
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {keys_schema} CASCADE")


def run_view(
    spark: Any, social: Social, view: View, reports: list[BatchReport] | None = None
) -> None:
    hook = None if reports is None else reports.append
    job = ViewJob(spark, view, social.feed.kafka, social.options, on_batch=hook)
    query = job.start(available_now=True)
    query.awaitTermination(600)
    assert query.exception() is None
    job.close()


def profiles(view: View) -> dict[int, dict[str, Any]]:
    return {int(e.key): dict(e.fields) for e in view.store.scan("profiles")}


def search_docs(view: View) -> dict[int, dict[str, Any]]:
    keep = ("text", "hashtags", "author_handle", "author_name")
    return {int(e.key): {k: e.fields.get(k) for k in keep} for e in view.store.scan("posts")}


def timelines(social: Social) -> dict[int, list[int]]:
    with psycopg.connect(social.dsn) as conn:
        rows = conn.execute(
            f"SELECT user_id, post_id FROM {social.schema}.timeline"
            " ORDER BY user_id, created_at DESC, post_id DESC"
        ).fetchall()
    out: dict[int, list[int]] = {}
    for user_id, post_id in rows:
        out.setdefault(int(user_id), []).append(int(post_id))
    return out


def assert_views_match(social: Social) -> None:
    state = social.feed.state
    assert profiles(social.profile) == expected_profiles(state)
    assert search_docs(social.search) == expected_search(state)
    expected = expected_timelines(state)
    assert timelines(social) == expected
    assert expected == timelines_by_sql(social.dsn, state.posts.values(), state.follows)


def assert_each_view_replays_to_the_same_state_while_reads_go_on(
    spark: Any, social: Social
) -> None:
    """Each view rebuilt from offset zero and swapped in while a reader queries all three:
    no read fails, every read answers what the views answered before (nothing writes
    meanwhile), and the views hold what they held."""
    before = (profiles(social.profile), search_docs(social.search), timelines(social))
    users = sorted(social.feed.state.users)[:5]
    # Every post matching the word: BM25 scores (hence the order and a top-k cut) depend on
    # the index's statistics, which count deleted documents until a merge; a rebuilt index
    # holds the same posts with other statistics, so the answer compared is the set of hits.
    every = len(before[1]) + 1

    def answer() -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]], list[Any]]:
        hits = social.search.queries[0].run(q="kafka", limit=every)
        return (
            sorted(
                ({k: v for k, v in h.items() if k != "score"} for h in hits),
                key=lambda h: h["post_id"],
            ),
            [social.timeline.queries[0].run(user_id=user_id) for user_id in users],
            [social.profile.queries[0].run(user_id=user_id) for user_id in users],
        )

    answer_before = answer()
    search_hits, user_timelines, user_profiles = answer_before
    assert search_hits and len(search_hits) < every
    assert [[p["post_id"] for p in t] for t in user_timelines] == [
        before[2].get(user_id, [])[:20] for user_id in users
    ]
    assert user_profiles == [before[0][user_id] for user_id in users]

    errors: list[BaseException] = []
    # Per read: the phases it began and ended in (2i + 1: while view i is replayed, 0 before
    # the first replay, 2i + 2 after replay i returned) and the parts that differed.
    reads: list[tuple[int, int, list[str]]] = []
    phase = [0]
    settled = [threading.Event() for _ in range(2 * len(social.views) + 1)]  # read in phase
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            began = phase[0]
            try:
                got = answer()
            except BaseException as exc:  # any failure of a read is a test failure
                errors.append(exc)
                continue
            differ = [
                part
                for part, now, then in zip(
                    ("search", "timelines", "profiles"), got, answer_before, strict=True
                )
                if now != then
            ]
            ended = phase[0]
            reads.append((began, ended, differ))
            if began == ended:
                settled[began].set()

    reader = threading.Thread(target=read)
    reader.start()
    try:
        assert settled[0].wait(60), errors  # the reader has read before the first replay
        for i, view in enumerate(social.views):
            old = view.store.live_generation()
            phase[0] = 2 * i + 1
            result = replay(spark, view, social.feed.kafka, social.options)
            phase[0] = 2 * i + 2
            assert result.replaced == old and view.store.live_generation() == result.generation
        assert settled[-1].wait(60), errors  # and once after the last replay returned
    finally:
        stop.set()
        reader.join(60)
    assert not reader.is_alive()
    assert errors == [] and len(reads) > 10
    assert [r for r in reads if r[2]] == []  # every read answered what was answered before
    # Reads began and ended while each view was replayed.
    assert all(settled[2 * i + 1].is_set() for i in range(len(social.views)))
    assert (profiles(social.profile), search_docs(social.search), timelines(social)) == before
    assert_views_match(social)


def test_three_views_equal_the_reference_after_a_mixed_workload_and_a_replay(
    spark: Any, social: Social
) -> None:
    social.feed.run(2500)
    state = social.feed.state
    assert len(state.posts) > 300 and len(state.follows) > 100
    for view in social.views:
        reports: list[BatchReport] = []
        run_view(spark, social, view, reports)
        assert len(reports) >= 3  # several micro-batches (maxOffsetsPerTrigger)
    assert_views_match(social)

    # Searching a post's own marker word finds it first, with its author.
    [query] = social.search.queries
    for post_id in sorted(state.posts)[:10]:
        [top, *_] = query.run(q=f"p{post_id}", limit=3)
        author = state.users.get(state.posts[post_id]["author_id"])
        assert top["post_id"] == post_id
        assert top["author_handle"] == (None if author is None else author["handle"])

    # More changes, re-sent old records (upstream at-least-once), renames: the views continue
    # from their stores and stay exact - search alone first, then all three in one shared
    # query, in which search, ahead of the others, folds only what its stores lack.
    social.feed.resend(social.feed.sent[:600])
    social.feed.run(800)
    run_view(spark, social, social.search)
    social.feed.run(400)
    shared_reports: list[BatchReport] = []
    group = ViewGroupJob(
        spark, social.views, social.feed.kafka, social.options, on_batch=shared_reports.append
    )
    query = group.start(available_now=True)
    query.awaitTermination(600)
    assert query.exception() is None
    group.close()
    assert_views_match(social)
    batches = {
        v.name: [r.batch_id for r in shared_reports if r.view == v.name] for v in social.views
    }
    assert len(batches[social.search.name]) >= 3 and len(set(map(tuple, batches.values()))) == 1
    first = {r.view: r for r in shared_reports if r.batch_id == 0}
    assert (first[social.search.name].applied, first[social.search.name].folded) == (False, 0)
    assert first[social.timeline.name].applied and first[social.timeline.name].folded > 0

    # A rename reaches every post of that user in the index within the next batch.
    author = next(p["author_id"] for p in state.posts.values() if p["author_id"] in state.users)
    social.feed.upsert_user(author, "zqx-renamed", "Zqx Person")
    social.feed.flush()
    run_view(spark, social, social.search)
    hits = social.search.queries[0].run(q="zqx", limit=100)
    assert {h["post_id"] for h in hits} == {
        post_id for post_id, p in state.posts.items() if p["author_id"] == author
    }
    assert {(h["author_handle"], h["author_name"]) for h in hits} == {("zqx-renamed", "Zqx Person")}

    # Each view, caught up, replayed from offset zero while reads go on: the same state.
    for view in (social.profile, social.timeline):
        run_view(spark, social, view)
    assert_each_view_replays_to_the_same_state_while_reads_go_on(spark, social)


def test_a_view_whose_store_fails_leaves_the_shared_query_and_the_others_go_on(
    spark: Any, social: Social
) -> None:
    social.feed.run(600)
    assert social.feed.registry_url is not None
    with socket.socket() as probe:  # a port where no Redis listens: the profile cache is down
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    broken = profile_view(
        f"redis://127.0.0.1:{port}/0",
        social.profile.topics,
        social.profile.name,
        registry_url=social.feed.registry_url,
    )
    lines: list[str] = []
    runner = ViewRunner(
        spark,
        [social.search, broken, social.timeline],
        social.feed.kafka,
        social.options,
        log=lines.append,
        min_backoff_s=0.5,
        max_backoff_s=2.0,
    )
    assert [v.specs for v in runner.views] == [(social.search, broken, social.timeline)]
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, args=(stop,), daemon=True)
    thread.start()
    state = social.feed.state
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if search_docs(social.search) == expected_search(state) and timelines(
                    social
                ) == expected_timelines(state):
                    break
            except psycopg.errors.UndefinedTable:  # the timeline's first batch makes its table
                pass
            time.sleep(0.5)
    finally:
        stop.set()
        thread.join(60)
    assert search_docs(social.search) == expected_search(state), lines
    assert timelines(social) == expected_timelines(state), lines
    assert f"view {broken.name}: runs on its own query from now on" in lines
    assert sorted(v.name for v in runner.views) == sorted(
        [broken.name, f"{social.search.name}+{social.timeline.name}"]
    )
    assert not thread.is_alive()


def test_poison_changes_go_to_the_dlq_and_the_profile_cache_converges(
    spark: Any, social: Social
) -> None:
    """One poison record of each kind on ``cdc.public.users`` among valid changes, through the
    real profile view job (Spark, Redis): each poison record reaches ``dlq.<view>`` unchanged
    with its reason, and the cache equals the reference of the valid changes."""
    social.feed.run(150)
    user = sorted(social.feed.state.users)[0]
    poison = poison_samples(user)
    for key, value, _ in poison:
        social.feed.producer.produce(social.feed.users_topic, key=key, value=value)
    social.feed.run(150)
    reports: list[BatchReport] = []
    run_view(spark, social, social.profile, reports)
    assert sum(r.rejected for r in reports) == len(poison)
    assert profiles(social.profile) == expected_profiles(social.feed.state)

    kafka = social.feed.kafka
    consumer = Consumer(kafka.client_properties(**{"group.id": f"dlq-{social.profile.name}"}))
    consumer.assign([TopicPartition(dlq_topic(social.profile.name), 0, 0)])
    dead: list[Any] = []
    deadline = time.monotonic() + 30
    while len(dead) < len(poison) and time.monotonic() < deadline:
        dead += [m for m in consumer.consume(len(poison), timeout=2) if m.error() is None]
    consumer.close()
    letters = {(m.key(), m.value()): dict(m.headers() or []) for m in dead}
    assert len(dead) == len(poison)
    for key, value, word in poison:
        headers = letters[(key, value)]
        assert word in headers[REASON_HEADER].decode()
        assert headers["tributary.source.topic"].decode() == social.feed.users_topic
