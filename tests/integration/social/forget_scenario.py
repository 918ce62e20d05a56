"""Forgetting a user end to end (issue 23): real CDC, event store, views process, Spark.

:func:`a_forgotten_user_is_gone_from_every_view_and_every_replay` runs in the take-over test
(tests/integration/social/test_takeover.py), on the world its `tributary run cdc commands
views` keeps running once the take-over is proven: one world fewer (a database, CDC, a views
process and their first batches) in the suite's Spark chain.

A user U with posts, likes, follows both ways and a profile; `tributary forget user U` first
refuses while the users table holds U (printing the DELETE), then, once the application
deleted its row, destroys U's key and appends ``SubjectForgotten``. Once the views applied
that event's position token (the batch that carries it), no view answers anything of U
(search by name and post text, profile, every timeline) and every other user's data equals
the reference; forgetting again is a no-op. Confluent's ``AvroDeserializer`` reading
``events.post`` sees U's post text only as opaque ciphertext; a replay of each view from offset
zero is identical to the purged live view and holds nothing of U; verify is clean.

Crash safety by crashing: `tributary forget` is killed with SIGKILL at each of its steps
before its commit (the test's step hook pauses it there), which leaves U untouched, and the
rerun forgets U as a run without a crash does; a second user V's forget is killed right after
its commit (before it answered): V is forgotten, and the rerun says so with the audit event's
position token. Both end as a forget without a crash does: key gone, exactly one
``SubjectForgotten``, the ``cdc.*.users`` key tombstoned, every view purged.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from event_store.forgetting import FORGET_STEPS
from infra.client import TributaryClient
from infra.polling import Deadline, poll_until
from infra.verify import verify
from infra.views import views_config
from spark_streaming.replay import replay
from tests.integration.cli_process import ROOT, run_tributary
from tests.integration.conftest import Endpoints
from tests.integration.kafka_reading import read_topic
from tests.integration.social.world import Workload, World, views_equal_the_truth
from views.catalog import configured_views

SCENARIO_S = 300  # the scenario's waits draw on one budget of this many seconds
U = 77  # the workload's users are 1..39
SECRET, NAME = "zqxsecret", "Zelda Quux"
V = 78  # forgotten too, its forget killed right after its commit
V_SECRET, V_NAME = "vvwsecret", "Vera Vole"


def tributary(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **{f"TRIBUTARY_{k}": v for k, v in world.env.items()}}
    return run_tributary(env, *args)


def forget_killed_at(world: World, tmp_path: Path, step: str, user: int) -> None:
    """`tributary forget user USER` as a process of its own, paused by the test's step hook
    at ``step`` and killed there with SIGKILL (before it answered anything)."""
    marker = tmp_path / f"forget-{user}-{step}"
    env = {
        **os.environ,
        **{f"TRIBUTARY_{k}": v for k, v in world.env.items()},
        "TRIBUTARY_FORGET_STEP_HOOK": "tests.integration.social.forget_steps:pause",
        "TRIBUTARY_TEST_FORGET_PAUSE_AT": step,
        "TRIBUTARY_TEST_FORGET_MARKER": str(marker),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "forget", "user", str(user), "--json"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise AssertionError(f"forget exited {proc.returncode} before {step}: {out}{err}")
            assert time.monotonic() < deadline, f"forget never reached {step}"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
    assert marker.read_text() == step
    assert proc.returncode == -signal.SIGKILL and out == b""  # killed before it answered


def forget_state(dsn: str, user: int) -> tuple[bool | None, int]:
    """Whether USER's key is destroyed (None: no key row) and how many ``SubjectForgotten``
    events its audit stream holds."""
    with psycopg.connect(dsn) as conn:
        key = conn.execute(
            "SELECT key IS NULL FROM event_store.subject_keys"
            " WHERE subject_type = 'user' AND subject_id = %s",
            (str(user),),
        ).fetchone()
        audits = conn.execute(
            "SELECT count(*) FROM event_store.events"
            " WHERE stream_id = %s AND event_type = 'SubjectForgotten'",
            (f"user-{user}",),
        ).fetchone()
    assert audits is not None
    return (None if key is None else bool(key[0])), int(audits[0])


def tombstoned(world: World, user: int) -> bool:
    """Whether the last record of USER's key on the compacted users topic is a tombstone."""
    topic = f"{world.settings.cdc_topic_prefix}.public.users"
    last: dict[int, bytes | None] = {}
    for record in read_topic(world.settings.kafka(), topic):
        if record.key is not None:
            last[int(json.loads(record.key)["id"])] = record.value
    return user in last and last[user] is None


def holds_of(views: dict[str, Any], dsn: str, user: int, words: tuple[str, ...]) -> list[str]:
    """Everything of USER any of the three views answers or holds (``words``: of the user's
    name and posts, searched for)."""
    found = [
        f"search {h['post_id']}"
        for q in words
        for h in views["search"].queries[0].run(q=q, limit=100)
    ]
    found += [
        f"search doc {e.key}"
        for e in views["search"].store.scan("posts")
        if e.fields["author_id"] == user
    ]
    try:
        views["profile"].queries[0].run(user_id=user)
        found.append("profile")
    except LookupError:
        pass
    found += [
        f"profile follows {e.key}"
        for e in views["profile"].store.scan("follows")
        if user in (e.fields["follower_id"], e.fields["followee_id"])
    ]
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT user_id, post_id FROM views.timeline WHERE user_id = %s OR author_id = %s",
            (user, user),
        ).fetchall()
    found += [f"timeline {r}" for r in rows]
    return found


def holds_of_u(views: dict[str, Any], dsn: str) -> list[str]:
    return holds_of(views, dsn, U, (SECRET, "Zelda")) + holds_of(views, dsn, V, (V_SECRET, "Vera"))


def a_forgotten_user_is_gone_from_every_view_and_every_replay(
    world: World,
    stack: Endpoints,
    spark: Any,
    tmp_path: Path,
    views_alive: Callable[[], bool],
    stop_views: Callable[[], None],
) -> None:
    """The scenario of the module's docstring, on ``world`` with CDC (``public.users`` and
    the events table) and the views running (``views_alive`` says whether they still are;
    ``stop_views`` stops them before the replays)."""
    budget = Deadline(SCENARIO_S)
    views = {v.name: v for v in configured_views(views_config(world.settings)).values()}
    workload = Workload(world.settings)
    workload.next_post = 3 * 10**6  # above the post ids the world's commands already used
    for _ in range(120):
        workload.step()
    workload.user(U, NAME)
    others = sorted(workload.users - {U})
    u_posts = [50_001, 50_002, 50_003]
    for post_id in u_posts:
        assert workload.send(
            "CreatePost", {"post_id": post_id, "author_id": U, "text": f"{SECRET} {post_id} #kafka"}
        )
    assert workload.send("EditPost", {"post_id": u_posts[0], "text": f"{SECRET} edited"})
    for other in others[:3]:
        assert workload.send("FollowUser", {"follower_id": U, "followee_id": other})
        assert workload.send("FollowUser", {"follower_id": other, "followee_id": U})
    liked = next(iter(workload.posts))
    workload.send("LikePost", {"post_id": liked, "user_id": U})
    workload.user(V, V_NAME)
    assert workload.send(
        "CreatePost", {"post_id": 50_010, "author_id": V, "text": f"{V_SECRET} #spark"}
    )
    assert workload.send("FollowUser", {"follower_id": others[0], "followee_id": V})
    workload.users -= {U, V}  # the random workload goes on around them, never touches them
    for _ in range(60):
        workload.step()

    def converged() -> bool:
        assert views_alive(), "the views stopped"
        try:
            return views_equal_the_truth(views, world.dsn)
        except psycopg.errors.UndefinedTable:  # the timeline's first batch makes its table
            return False

    poll_until(converged, budget.left(240), "the views to equal the source of truth", 1)
    assert len(holds_of_u(views, world.dsn)) > 5  # U is everywhere before

    # The application still holds U: forget refuses, prints the DELETE, changes nothing.
    refused = tributary(world, "forget", "user", str(U), "--json")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    body = json.loads(refused.stdout)
    assert body["status"] == "pending" and body["remaining"] == [
        {"table": "public.users", "rows": 1}
    ]
    assert body["sql"] == [f'DELETE FROM "public"."users" WHERE "id"::text = \'{U}\';']
    assert tributary(world, "forget", "user", "999999").returncode == 1  # unknown subject
    workload.delete_user(U)  # what the application does (CDC tombstones cdc.*.users' key)
    workload.delete_user(V)

    # kill -9 of forget at each step before its commit: U stays as it was (key kept, no audit
    # event), and the rerun forgets U as one run without a crash does.
    for step in FORGET_STEPS[:-1]:
        forget_killed_at(world, tmp_path, step, U)
        assert forget_state(world.dsn, U) == (False, 0), step
    done = tributary(world, "forget", "user", str(U), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    forgotten = json.loads(done.stdout)
    assert forgotten["status"] == "forgotten"
    token = forgotten["position_token"]
    assert token == f"subject/user-{U}@1"
    # kill -9 of V's forget after its commit, before it answered: V is forgotten; the rerun
    # says so and gives the audit event's position token to wait for.
    forget_killed_at(world, tmp_path, FORGET_STEPS[-1], V)
    assert forget_state(world.dsn, V) == (True, 1)
    rerun = tributary(world, "forget", "user", str(V), "--json")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert json.loads(rerun.stdout)["status"] == "already"
    v_token = json.loads(rerun.stdout)["position_token"]
    assert v_token == f"subject/user-{V}@1"

    client = TributaryClient(world.settings, list(views.values()))
    try:
        client.wait_for(token, timeout=budget.left(60))  # every view applied that batch
        client.wait_for(v_token, timeout=budget.left(60))
    finally:
        client.close()
    assert holds_of_u(views, world.dsn) == []
    for user in (U, V):  # as a forget without a crash leaves them
        assert forget_state(world.dsn, user) == (True, 1), user
        assert tombstoned(world, user), user
    assert views_equal_the_truth(views, world.dsn)  # everyone else as the reference says
    again = tributary(world, "forget", "user", str(U), "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "already"
    assert forget_state(world.dsn, U) == (True, 1)  # the no-op appended nothing

    # A downstream consumer with Confluent's deserializer: U's text is ciphertext only.
    topic = f"{world.settings.event_topic_prefix}post"
    consumer = Consumer(stack.kafka.client_properties(**{"group.id": f"dl-{topic}"}))
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": stack.settings.registry_url}))
    seen: dict[int, Any] = {}
    raw: list[bytes] = []
    reading = Deadline(60)
    while set(seen) != set(u_posts) and reading.left(60) > 0:
        for message in consumer.consume(500, timeout=1):
            if message.error() is not None or message.value() is None:
                continue
            raw.append(message.value())
            record = deserialize(message.value(), SerializationContext(topic, MessageField.VALUE))
            if record.get("author_id") == U:
                seen[record["post_id"]] = record["text"]
    consumer.close()
    assert sorted(seen) == u_posts
    assert all(isinstance(t, bytes) and t.startswith(b"tx1:") for t in seen.values()), seen
    assert not any(SECRET.encode() in value for value in raw)

    # A replay of each view from offset zero: identical to the purged view, nothing of U.
    stop_views()
    config = views_config(world.settings)
    for name in ("search", "profile", "timeline"):
        result = replay(spark, views[name], config.kafka, config.job_options(replay=True))
        assert result.compared and result.identical, (name, result)
    assert holds_of_u(views, world.dsn) == []
    assert views_equal_the_truth(views, world.dsn)

    report = verify(world.settings)
    assert report.views and all(d == [] for d in report.views.values()), report.views
