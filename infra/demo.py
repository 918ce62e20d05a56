"""The demo: the social network on the embedded local stack, end to end.

1. start the local stack (PostgreSQL, SeaweedFS + Tansu broker, Redis);
2. create the CRUD ``users`` table and the event store;
3. run CDC, the command processor and the mirror view, each in its own supervised process;
4. write users directly (CRUD) and send post/follow commands through the ``commands`` topic;
5. show the results: command results, the Avro events on ``events.<type>`` decoded through
   ``_schemas``, and ``views.public_users`` mirrored by Spark from ``cdc.public.users``.
"""

import json
import os
import sys
import threading
import time
from collections.abc import Callable

import psycopg
from rich.console import Console
from rich.table import Table

from connectors.avro import SCHEMAS_TOPIC, SchemaCatalog
from connectors.kafka import TopicAdmin
from connectors.kafka.reading import read_topic
from connectors.postgres import make_engine
from event_store import create_schema
from event_store.command import Accepted
from event_store.command_topic import CommandClient, CommandTopics, ensure_topics
from examples.social import prepare_database, upsert_user, users_table
from infra.settings import Settings
from infra.stack import LocalStack
from infra.supervision import Supervisor

USERS = [(1, "ada", "Ada Lovelace"), (2, "alan", "Alan Turing"), (3, "grace", "Grace Hopper")]


def demo_commands(run: int) -> list[tuple[str, dict[str, object]]]:
    """This run's commands; post ids are new each run, so the demo can run again."""
    first, second = run * 10 + 1, run * 10 + 2
    return [
        ("CreatePost", {"post_id": first, "author_id": 1, "text": "Notes on the #engine"}),
        ("CreatePost", {"post_id": second, "author_id": 3, "text": "Found a #bug in the relay"}),
        ("EditPost", {"post_id": second, "text": "Found the first #bug, a moth"}),
        ("FollowUser", {"follower_id": 2, "followee_id": 1}),  # rejected on a second run
        ("FollowUser", {"follower_id": 2, "followee_id": 2}),  # rejected: following oneself
        ("DeletePost", {"post_id": 9}),  # rejected: no such post
    ]


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(1)
    raise TimeoutError(f"demo: timed out waiting for {what}")


def _read(s: Settings, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    return [(r.key, r.value) for r in read_topic(s.kafka("tributary-demo"), topic)]


def run_demo(s: Settings, console: Console) -> None:
    stack = LocalStack(s)
    console.rule("1. the local stack")
    for c in stack.up():
        console.print(f"  {c.name:12} {c.state:5} {c.endpoint}")

    console.rule("2. tables: users (CRUD) and the event store")
    engine = make_engine(s.postgres())
    with engine.begin() as conn:
        prepare_database(conn)
        create_schema(conn, s.event_store_schema)

    console.rule("3. CDC, the command processor and the mirror view, supervised")
    os.environ.setdefault("TRIBUTARY_MIRROR_TABLES", "public.users")
    os.environ["TRIBUTARY_HOME"] = str(s.home.resolve())
    stop = threading.Event()
    supervisor = Supervisor(
        ["cdc", "commands", "views"],
        lambda name: [sys.executable, "-m", "infra.cli", "run", name],
        (s.home / "logs").resolve(),
        announce=lambda line: console.print(f"  run: {line}"),
    )
    worker = threading.Thread(target=supervisor.run, args=(stop,), daemon=True)
    worker.start()
    try:
        _demo_traffic(s, console, engine)
    finally:
        stop.set()
        worker.join(180)
    console.rule("done")
    console.print(
        "The stack is still up: try `tributary topics`, `tributary status`, "
        '`tributary command CreatePost --data \'{"post_id": 5, "author_id": 2, "text": "hi"}\' '
        "--wait`, `tributary run` and `tributary down`."
    )


def _demo_traffic(s: Settings, console: Console, engine: object) -> None:
    from sqlalchemy import Engine

    assert isinstance(engine, Engine)
    with engine.begin() as conn:
        for user_id, handle, name in USERS:
            upsert_user(conn, users_table(), user_id, handle, name)
    console.print(f"  wrote {len(USERS)} users with plain SQL (CRUD)")

    console.rule("4. commands through the `commands` topic")
    topics = CommandTopics(s.commands_topic, s.command_results_topic, s.command_topic_partitions)
    ensure_topics(s.kafka("tributary-demo"), topics)
    client = CommandClient(s.kafka("tributary-demo"), topics)
    results = Table("command", "data", "result")
    commands = demo_commands(int(time.time()) % 1_000_000)
    edited_key = f"post-{commands[2][1]['post_id']}".encode()
    for command_type, data in commands:
        result = client.send_and_wait(command_type, data, timeout=120)
        if isinstance(result, Accepted):
            summary = f"[green]accepted[/]: {result.stream_id} now at version {result.version}"
        else:
            summary = f"[red]rejected[/]: {result.reason}"
        results.add_row(command_type, json.dumps(data), summary)
    console.print(results)

    console.rule("5. events on Kafka (via CDC of the events table), Avro-decoded")
    _wait(
        lambda: sum(k == edited_key for k, _ in _read(s, "events.post")) >= 2,
        120,
        "this run's events on events.post",
    )
    catalog = SchemaCatalog()
    for key, value in _read(s, SCHEMAS_TOPIC):
        catalog.add_record(key, value)
    events = Table("topic", "key", "version", "event", "data")
    event_topics = [
        t for t in TopicAdmin(s.kafka("tributary-demo")).topic_names() if t.startswith("events.")
    ]
    for topic in event_topics:
        for key, value in _read(s, topic):
            event = catalog.decode(value or b"")
            events.add_row(
                topic,
                (key or b"").decode(),
                str(event["version"]),
                event["event_type"],
                event["data"][:60],
            )
    console.print(events)

    console.rule("6. views.public_users, mirrored by Spark from cdc.public.users")
    dsn = s.postgres().dsn

    def mirrored() -> bool:
        with psycopg.connect(dsn) as pg:
            row = pg.execute("SELECT count(*) FROM views.public_users").fetchone()
        return row is not None and row[0] >= len(USERS)

    _wait(mirrored, 240, "the mirror view")
    with psycopg.connect(dsn) as pg:
        rows = pg.execute("SELECT id, handle, display_name FROM views.public_users ORDER BY id")
        mirror = Table("id", "handle", "display_name")
        for row in rows.fetchall():
            mirror.add_row(*(str(v) for v in row))
    console.print(mirror)
