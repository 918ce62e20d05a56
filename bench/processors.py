"""Command processors side by side: commands/s with 1, 2, ... processors (not a test).

    .venv/bin/python bench/processors.py [--commands 3000] [--processors 1,2] [--rounds 1]
        [--groups]

Starts its own local stack (PostgreSQL, the broker in memory, the schema registry) on free
ports. For each count of processors: fresh ``commands``/``command-results`` topics (4
partitions), that many `tributary run commands` processes (as production runs them), waited
for until they own every partition between them (``connectors.partition_owners``); then
``--commands`` CreatePost commands (distinct posts, 16 authors) are produced at once, and the
clock runs until the event store has recorded all of them. Printed: commands/s per count
and its ratio to one processor's, and how long the processors took to divide the
partitions (start to owning all; a joining second one to its share).

``--groups`` also times Kafka's own group membership on the same broker, the alternative:
confluent-kafka consumers with ``partition.assignment.strategy=cooperative-sticky`` and the
smallest session timeout the broker allows by default (6 s): the first member's assignment,
a second member joining (both assigned), and the first leaving (the second owning all).

Measured (rounds of 3,000 commands, a 2-core machine, the memory broker, two runs): one
processor 375-552 commands/s (median of 5 rounds 467), two 635-1,138 (median 760; in the
same round 1.4x-2.5x, median 1.5x), three 434-756 (3 rounds): on two cores the curve flattens
at two processors and falls at three, which share the cores with PostgreSQL, the broker
and each other. Two gain because a lone processor is not CPU-bound (each command waits for
two PostgreSQL round trips, which the other's work fills). The Kafka group on
the same broker: first member assigned after 3.0 s, a joiner divided after 11.1 s, a
leaver's partitions moved in 4.0 s; the processors divided theirs 1.5-2.2 s after the second
was started (its start-up included).
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition

from bench.stopping import stop_cleanly_on_sigterm
from connectors.kafka import TopicAdmin
from connectors.partition_owners import owners
from connectors.postgres import make_engine
from event_store import create_schema
from event_store.command_topic import CommandEnvelope, CommandTopics, ensure_topics
from examples.social import prepare_database, upsert_user, users_table
from infra.commands import command_topics, ownership_group
from infra.settings import Settings
from infra.stack import LocalStack
from infra.stack.isolated import isolated_settings, settings_env

ROOT = Path(__file__).resolve().parents[1]
USERS = 16
PARTITIONS = 4


def _processors(
    settings: Settings, env: dict[str, str], count: int
) -> list[subprocess.Popen[bytes]]:
    logs = settings.home / "bench-logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for n in range(count):
        with open(logs / f"{settings.command_processor_name}-{n}.log", "wb") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "infra.cli", "run", "commands", "--metrics-port", "0"],
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    return procs


def _shares(settings: Settings) -> Counter[str | None]:
    found = owners(settings.postgres().dsn, ownership_group(settings))
    return Counter(member for member, _ in found.values())


def _wait(check: Any, timeout: float, what: str) -> float:
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            raise TimeoutError(what)
        time.sleep(0.05)
    return time.monotonic() - began


def _recorded(settings: Settings) -> int:
    with psycopg.connect(settings.postgres().dsn) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM {settings.event_store_schema}.commands"  # type: ignore[arg-type]
        ).fetchone()
    return 0 if row is None else int(row[0])


def one_round(base: Settings, count: int, commands: int, first_post: int) -> dict[str, float]:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    settings = base.model_copy(
        update={
            "commands_topic": f"commands-{name}",
            "command_results_topic": f"results-{name}",
            "command_processor_name": name,
        }
    )
    env = {
        **settings_env(settings),
        "TRIBUTARY_COMMANDS_TOPIC": settings.commands_topic,
        "TRIBUTARY_COMMAND_RESULTS_TOPIC": settings.command_results_topic,
        "TRIBUTARY_COMMAND_PROCESSOR_NAME": name,
        "TRIBUTARY_COMMAND_TOPIC_PARTITIONS": str(PARTITIONS),
        "PYTHONPATH": str(ROOT),
    }
    kafka = settings.kafka("bench-processors")
    ensure_topics(kafka, command_topics(settings))
    procs = _processors(settings, env, 1)
    figures: dict[str, float] = {}
    try:
        figures["own_all_s"] = _wait(
            lambda: None not in _shares(settings) and len(_shares(settings)) == 1,
            120,
            "the first processor owning every partition",
        )
        if count > 1:
            procs += _processors(settings, env, count - 1)
            began = time.monotonic()
            _wait(
                lambda: len(_shares(settings)) == count and None not in _shares(settings),
                120,
                "the processors dividing the partitions",
            )
            figures["divided_s"] = time.monotonic() - began  # includes the joiners' start-up
        before = _recorded(settings)
        producer = Producer(
            kafka.client_properties(**{"linger.ms": 20, "enable.idempotence": True})
        )
        for i in range(commands):
            post = first_post + i
            envelope = CommandEnvelope(
                f"{name}-{i}",
                "CreatePost",
                {"post_id": post, "author_id": 1 + i % USERS, "text": f"bench #{i % 7}"},
            )
            producer.produce(settings.commands_topic, key=f"post-{post}", value=envelope.to_json())
            if i % 1000 == 0:
                producer.poll(0)
        producer.flush(60)
        began = time.monotonic()
        _wait(lambda: _recorded(settings) >= before + commands, 600, "every command recorded")
        took = time.monotonic() - began
        figures["commands_per_s"] = commands / took
        per = Counter(
            member
            for member, _ in owners(settings.postgres().dsn, ownership_group(settings)).values()
        )
        figures["owners"] = len(per)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
        TopicAdmin(kafka).delete(settings.commands_topic, settings.command_results_topic)
    return figures


def kafka_groups(settings: Settings) -> dict[str, float]:
    """Cooperative-sticky group membership on this broker: assignment times."""
    topic = f"groups-{uuid.uuid4().hex[:8]}"
    kafka = settings.kafka("bench-groups")
    ensure_topics(kafka, CommandTopics(topic, f"{topic}-results", PARTITIONS))
    group = f"g-{uuid.uuid4().hex[:8]}"
    assigned: dict[str, set[int]] = {"a": set(), "b": set()}

    def consumer(name: str) -> Consumer:
        props = kafka.client_properties(
            **{
                "group.id": group,
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 1000,
                "enable.auto.commit": False,
            }
        )
        c = Consumer(props)

        def on_assign(_: Consumer, parts: list[TopicPartition]) -> None:
            assigned[name] |= {p.partition for p in parts}

        def on_revoke(_: Consumer, parts: list[TopicPartition]) -> None:
            assigned[name] -= {p.partition for p in parts}

        c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        return c

    figures: dict[str, float] = {}
    a = consumer("a")
    began = time.monotonic()
    while len(assigned["a"]) < PARTITIONS and time.monotonic() - began < 120:
        a.poll(0.05)
    figures["group_first_assigned_s"] = time.monotonic() - began
    b = consumer("b")
    began = time.monotonic()
    while (
        not assigned["b"]
        or len(assigned["a"]) + len(assigned["b"]) < PARTITIONS
        or len(assigned["a"]) == PARTITIONS
    ) and time.monotonic() - began < 120:
        a.poll(0.05)
        b.poll(0.05)
    figures["group_join_divided_s"] = time.monotonic() - began
    a.close()
    began = time.monotonic()
    while len(assigned["b"]) < PARTITIONS and time.monotonic() - began < 120:
        b.poll(0.05)
    figures["group_leave_taken_s"] = time.monotonic() - began
    b.close()
    TopicAdmin(kafka).delete(topic, f"{topic}-results")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commands", type=int, default=3000)
    parser.add_argument("--processors", default="1,2")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--groups", action="store_true")
    args = parser.parse_args()
    counts = [int(c) for c in args.processors.split(",")]
    settings = isolated_settings("tributary-bench-", broker_storage="memory")
    stack = LocalStack(settings)
    stop_cleanly_on_sigterm()
    stack.up()
    try:
        engine = make_engine(settings.postgres())
        with engine.begin() as conn:
            prepare_database(conn)
            create_schema(conn, settings.event_store_schema)
            for user in range(1, USERS + 1):
                upsert_user(conn, users_table(), user, f"u{user}")
        engine.dispose()
        print(f"machine: {os.cpu_count()} cores; {args.commands} CreatePost commands a round")
        rates: dict[int, list[float]] = {c: [] for c in counts}
        post = 1
        for _ in range(args.rounds):
            for count in counts:
                figures = one_round(settings, count, args.commands, post)
                post += args.commands
                rates[count].append(figures["commands_per_s"])
                print(
                    f"{count} processor(s): "
                    + ", ".join(f"{k} {v:.2f}" for k, v in figures.items()),
                    flush=True,
                )
        one = max(rates[counts[0]])
        for count in counts:
            best = max(rates[count])
            print(
                f"{count} processor(s): best {best:.0f} commands/s ({best / one:.2f}x {counts[0]})"
            )
        if args.groups:
            print(
                "kafka group (cooperative-sticky): "
                + ", ".join(f"{k} {v:.2f}" for k, v in kafka_groups(settings).items())
            )
    finally:
        stack.down(purge=True)
        shutil.rmtree(settings.home.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
