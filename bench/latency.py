"""Benchmark: how long a command takes to be visible in each view (not a test).

    .venv/bin/python bench/latency.py [--commands 1000] [--rate 20] [--trigger 1.0]

Starts its own local stack and the long-running parts (CDC, the command processor, the views:
search, profile, timeline and the users mirror) under the supervisor, creates users, then
sends commands at a steady rate through the ``commands`` topic (posts, edits, follows). For
each accepted command it measures, from the moment it was sent:

- ``result``: its result on ``command-results``;
- ``kafka``: its event on ``events.<type>`` (published by CDC from the event store);
- one figure per view: the first moment the view's store had committed past that event's
  offset (what a reader of the store sees), polled every 20 ms from the stores' ledgers.

Prints p50 / p95 / p99 / max per stage and the aim (p50 < 1 s, p99 < 2 s per view).
"""

import argparse
import os
import random
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from connectors.kafka import KafkaConfig, TopicAdmin
from connectors.kafka.offsets import probe_consumer, true_watermarks
from connectors.postgres import make_engine
from event_store import create_schema
from event_store.command import Accepted, result_from_json
from event_store.command_topic import CommandClient, CommandTopics, ensure_topics
from examples.social import prepare_database, upsert_user, users_table
from infra.settings import Settings
from infra.stack import LocalStack
from infra.stack.isolated import isolated_settings, settings_env
from infra.supervision import Supervisor
from infra.views import views_config
from spark_streaming.views import configured_views

USERS = 60


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Tail(threading.Thread):
    """Reads topics from their ends on, calling ``seen(message, now)`` for each record."""

    def __init__(self, kafka: KafkaConfig, topics: list[str], seen: Any) -> None:
        super().__init__(daemon=True)
        admin = TopicAdmin(kafka)
        probe = probe_consumer(kafka)
        parts = [(t, p) for t in topics for p in range(admin.partition_count(t) or 0)]
        marks = true_watermarks(probe, parts, fresh=lambda: probe_consumer(kafka))
        probe.close()
        self.consumer = Consumer(
            kafka.client_properties(
                **{"group.id": "bench-tail", "enable.auto.commit": False, "fetch.wait.max.ms": 10}
            )
        )
        self.consumer.assign([TopicPartition(t, p, marks[(t, p)][1]) for t, p in parts])
        self.seen = seen
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            for message in self.consumer.consume(500, timeout=0.05):
                if message.error() is None:
                    self.seen(message, time.monotonic())
        self.consumer.close()


class Progress(threading.Thread):
    """Polls each view's committed offsets; remembers when each offset was first passed."""

    def __init__(self, views: list[Any]) -> None:
        super().__init__(daemon=True)
        self.views = views
        self.history: dict[str, list[tuple[float, dict[str, dict[str, int]]]]] = {
            v.name: [] for v in views
        }
        self.halt = threading.Event()

    def run(self) -> None:
        generations = {v.name: v.store.live_generation() for v in self.views}
        while not self.halt.is_set():
            for view in self.views:
                try:
                    offsets = view.store.committed(generations[view.name]).offsets
                except Exception:
                    continue
                self.history[view.name].append((time.monotonic(), offsets))
            time.sleep(0.02)

    def visible(self, view: str, topic: str, partition: int, offset: int) -> float | None:
        for when, offsets in self.history[view]:
            if offsets.get(topic, {}).get(str(partition), -1) > offset:
                return when
        return None


@contextmanager
def running(settings: Settings, trigger: float) -> Iterator[dict[str, str]]:
    env = {
        **settings_env(settings),
        "TRIBUTARY_VIEWS": "examples.social.views:social_views",
        "TRIBUTARY_MIRROR_TABLES": "public.users",
        "TRIBUTARY_VIEW_TRIGGER_INTERVAL_S": str(trigger),
        "TRIBUTARY_CDC_HEARTBEAT_MS": "1000",
    }
    os.environ.update(env)
    stop = threading.Event()
    supervisor = Supervisor(
        ["cdc", "commands", "views"],
        lambda name: [sys.executable, "-m", "infra.cli", "run", name],
        (settings.home / "logs").resolve(),
        announce=lambda line: print(f"  run: {line}"),
    )
    worker = threading.Thread(target=supervisor.run, args=(stop,), daemon=True)
    worker.start()
    try:
        yield env
    finally:
        stop.set()
        worker.join(180)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commands", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=20.0, help="commands per second")
    parser.add_argument("--trigger", type=float, default=1.0, help="views' trigger interval, s")
    args = parser.parse_args()

    settings = isolated_settings(
        "tributary-latency-",
        views="examples.social.views:social_views",
        view_trigger_interval_s=args.trigger,
    )
    stack = LocalStack(settings)
    stack.up()
    try:
        engine = make_engine(settings.postgres())
        with engine.begin() as conn:
            prepare_database(conn)
            create_schema(conn, settings.event_store_schema)
            for user_id in range(1, USERS + 1):
                upsert_user(conn, users_table(), user_id, f"user{user_id}", f"User {user_id}")
        kafka = settings.kafka("bench-latency")
        topics = CommandTopics(
            settings.commands_topic,
            settings.command_results_topic,
            settings.command_topic_partitions,
        )
        ensure_topics(kafka, topics)
        with running(settings, args.trigger):
            bench(settings, kafka, topics, args)
    finally:
        stack.down()
        shutil.rmtree(settings.home.parent, ignore_errors=True)


def bench(settings: Settings, kafka: KafkaConfig, topics: CommandTopics, args: Any) -> None:
    rng = random.Random(3)
    client = CommandClient(kafka, topics)
    # Warm-up: the first post and follow create the event topics and start every query.
    client.send_and_wait(
        "CreatePost", {"post_id": 10**6, "author_id": 1, "text": "warm #up"}, timeout=180
    )
    client.send_and_wait("FollowUser", {"follower_id": 2, "followee_id": 1}, timeout=180)
    views = list(configured_views(views_config(settings)).values())
    social = [v for v in views if not v.name.startswith("mirror.")]
    event_topics = ["events.post", "events.follows"]
    deadline = time.monotonic() + 300
    admin = TopicAdmin(kafka)
    while not set(event_topics) <= set(admin.topic_names()):
        assert time.monotonic() < deadline, "CDC never published the warm-up events"
        time.sleep(0.5)
    while time.monotonic() < deadline:
        ends = {
            i.name: {str(p.partition): p.end_offset for p in i.partitions}
            for i in TopicAdmin(kafka).describe(event_topics)
        }
        done = bool(ends) and all(
            all(
                v.store.committed(v.store.live_generation()).offsets.get(t, {}).get(p, 0) >= e
                for t in event_topics
                if t in v.topics
                for p, e in ends.get(t, {}).items()
            )
            for v in social
        )
        if done:
            break
        time.sleep(1)
    warm = 300 - (deadline - time.monotonic())
    print(f"views warm after {warm:.0f}s; sending {args.commands} commands at {args.rate}/s")

    sent: dict[str, float] = {}
    results: dict[str, tuple[float, Accepted]] = {}
    events: dict[
        tuple[str, int], tuple[float, str, int, int]
    ] = {}  # (stream, version) -> when, topic, p, o

    def on_result(message: Any, now: float) -> None:
        value = message.value()
        if value is None:
            return
        import json

        result = result_from_json(json.loads(value))
        if isinstance(result, Accepted) and result.command_id in sent:
            results[result.command_id] = (now, result)

    def on_event(message: Any, now: float) -> None:
        headers = dict(message.headers() or [])
        version = int(headers.get("version", b"0"))
        key = (message.key() or b"").decode()
        events.setdefault(
            (key, version), (now, message.topic(), message.partition(), message.offset())
        )

    result_tail = Tail(kafka, [topics.results], on_result)
    event_tail = Tail(kafka, event_topics, on_event)
    progress = Progress(social)
    for thread in (result_tail, event_tail, progress):
        thread.start()
    posts: list[int] = []
    follows: set[tuple[int, int]] = set()
    interval = 1.0 / args.rate
    started = time.monotonic()
    for i in range(args.commands):
        roll = rng.random()
        if roll < 0.15 and posts:
            kind, data = "EditPost", {"post_id": rng.choice(posts), "text": f"edit {i} #bench"}
        elif roll < 0.40:
            a, b = rng.sample(range(1, USERS + 1), 2)
            if (a, b) in follows:
                kind, data = "UnfollowUser", {"follower_id": a, "followee_id": b}
                follows.discard((a, b))
            else:
                kind, data = "FollowUser", {"follower_id": a, "followee_id": b}
                follows.add((a, b))
        else:
            post_id = 1 + i
            posts.append(post_id)
            kind, data = (
                "CreatePost",
                {
                    "post_id": post_id,
                    "author_id": rng.randrange(1, USERS + 1),
                    "text": f"post {i} #bench",
                },
            )
        key = f"post-{data['post_id']}" if "post_id" in data else f"follows-{data['follower_id']}"
        command_id = f"bench-{i}"
        sent[command_id] = time.monotonic()
        client.send(kind, data, command_id, key)
        wait = started + (i + 1) * interval - time.monotonic()
        if wait > 0:
            time.sleep(wait)
    print(f"sent in {time.monotonic() - started:.1f}s; waiting for the views to catch up")
    time.sleep(15)
    for thread in (result_tail, event_tail, progress):
        thread.halt.set()
    for thread in (result_tail, event_tail, progress):
        thread.join(30)

    stages: dict[str, list[float]] = {"result": [], "kafka": []}
    for view in social:
        stages[view.name] = []
    missing = 0
    for command_id, (result_at, result) in results.items():
        began = sent[command_id]
        stages["result"].append(result_at - began)
        found = events.get((result.stream_id, result.version))
        if found is None:
            missing += 1
            continue
        when, topic, partition, offset = found
        stages["kafka"].append(when - began)
        for view in social:
            if topic not in view.topics:
                continue
            visible = progress.visible(view.name, topic, partition, offset)
            if visible is None:
                missing += 1
                continue
            stages[view.name].append(visible - began)
    print(f"\n{len(results)} accepted of {len(sent)} sent; {missing} measurements missing")
    if missing:
        for name in ("cdc", "views"):
            log = settings.home / "logs" / f"run-{name}.log"
            if log.exists():
                print(f"--- {log.name} (end)\n" + log.read_text(errors="replace")[-1500:])
    print(f"{'stage':<12}{'n':>6}{'p50 s':>9}{'p95 s':>9}{'p99 s':>9}{'max s':>9}")
    for stage, values in stages.items():
        if not values:
            continue
        print(
            f"{stage:<12}{len(values):>6}{statistics.median(values):>9.3f}"
            f"{percentile(values, 0.95):>9.3f}{percentile(values, 0.99):>9.3f}{max(values):>9.3f}"
        )
    print(f"aim per view: p50 < 1 s, p99 < 2 s (trigger interval {args.trigger:.1f} s)")


if __name__ == "__main__":
    main()
