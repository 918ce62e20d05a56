"""The demo: the social network on the embedded local stack, end to end (``tributary demo``
loads it by name: ``TRIBUTARY_DEMO``, ``examples.social.demo:run_demo`` by default).

1. start the local stack (PostgreSQL, SeaweedFS + Tansu broker, Redis);
2. create the CRUD ``users`` table and the event store;
3. run CDC, the command processor, the views (search, profile, timeline and the users mirror)
   and the HTTP API, each in its own supervised process;
4. create users with plain SQL and send a few hundred commands (posts, follows, edits) through
   the ``commands`` topic and the HTTP API, showing the three views fill in live;
5. rename a user and show search results follow; delete a post and show it leave every
   timeline (read-your-writes); replay the profile view from offset zero and show it
   identical;
6. print the HTTP endpoints and a summary; exit 0 when every check held.
"""

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
from rich.console import Console
from rich.live import Live
from rich.table import Table

from event_store import create_schema
from event_store.command_topic import CommandClient, CommandTopics, ensure_topics
from examples.social import prepare_database, upsert_user, users_table
from infra.polling import poll_until
from infra.settings import Settings
from infra.stack import LocalStack
from infra.supervision import Supervisor
from infra.views import views_config
from projections.view import View
from views.catalog import configured_views
from views.status import view_statuses

PEOPLE = [
    ("ada", "Ada Lovelace"), ("alan", "Alan Turing"), ("grace", "Grace Hopper"),
    ("edsger", "Edsger Dijkstra"), ("barbara", "Barbara Liskov"), ("donald", "Donald Knuth"),
    ("margaret", "Margaret Hamilton"), ("john", "John Backus"), ("frances", "Frances Allen"),
    ("ken", "Ken Thompson"), ("dennis", "Dennis Ritchie"), ("leslie", "Leslie Lamport"),
    ("jim", "Jim Gray"), ("michael", "Michael Stonebraker"), ("martin", "Martin Kleppmann"),
    ("pat", "Pat Helland"), ("jay", "Jay Kreps"), ("tyler", "Tyler Akidau"),
    ("matei", "Matei Zaharia"), ("radia", "Radia Perlman"), ("adele", "Adele Goldberg"),
    ("butler", "Butler Lampson"), ("shafi", "Shafi Goldwasser"), ("ivan", "Ivan Sutherland"),
]  # fmt: skip
TOPICS = ["kafka", "spark", "streams", "cdc", "debezium", "eventsourcing", "ddia", "joins"]
COMMANDS = 300
HTTP_CLIENTS = 8  # commands over HTTP in flight at once (each waits for its result)
COMMAND_EXAMPLE = {"type": "CreatePost", "data": {"post_id": 7, "author_id": 1, "text": "hi"}}


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Demo:
    settings: Settings
    console: Console
    views: dict[str, View]
    api: str
    checks: list[Check] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(int(time.time())))

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(Check(name, ok, detail))
        mark = "[green]✓[/]" if ok else "[red]✗[/]"
        self.console.print(f"  {mark} {name}: {detail}")


def run_demo(s: Settings, console: Console) -> bool:
    """Run the demo; True when every check held."""
    console.rule("1. the local stack")
    stack = LocalStack(s)
    for c in stack.up():
        console.print(f"  {c.name:12} {c.state:5} {c.endpoint}")

    console.rule("2. tables: users (CRUD) and the event store")
    dsn = s.postgres().dsn
    from connectors.postgres import make_engine

    engine = make_engine(s.postgres())
    with engine.begin() as conn:
        prepare_database(conn)
        create_schema(conn, s.event_store_schema)
    engine.dispose()
    console.print(f"  public.users and {s.event_store_schema}.events in {s.postgres().database}")

    console.rule("3. CDC, commands, views and the HTTP API, each in its own process")
    views = configured_views(views_config(s))
    demo = Demo(s, console, views, f"http://{s.api_host}:{s.api_port}")
    with supervised(s, console):
        wait_for_demo(lambda: _get(demo, "/health").status_code < 500, 180, "the HTTP API")
        console.print(f"  HTTP API on {demo.api} (OpenAPI at {demo.api}/docs)")
        fill(demo, dsn)
        rename(demo, dsn)
        delete(demo)
        replay_profile(demo)
        endpoints(demo)
    summary(demo)
    console.print(
        "The stack is still up: `tributary run` starts the parts again, `tributary status`"
        " shows them, `tributary down` stops the stack."
    )
    return all(c.ok for c in demo.checks)


@contextmanager
def supervised(s: Settings, console: Console) -> Iterator[None]:
    os.environ["TRIBUTARY_HOME"] = str(s.home.resolve())
    stop = threading.Event()
    supervisor = Supervisor(
        ["cdc", "commands", "views", "api"],
        lambda name: [sys.executable, "-m", "infra.cli", "run", name],
        (s.home / "logs").resolve(),
        announce=lambda line: console.print(f"  run: {line}"),
    )
    worker = threading.Thread(target=supervisor.run, args=(stop,), daemon=True)
    worker.start()
    try:
        yield
    finally:
        console.rule("stopping the parts")
        stop.set()
        worker.join(240)


def wait_for_demo(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``check`` until it holds; the parts are still starting, so a failed read or an
    HTTP error counts as not yet."""
    poll_until(check, timeout, f"demo: {what}", retry_on=(Exception,))


def _get(demo: Demo, path: str, **params: Any) -> httpx.Response:
    return httpx.get(demo.api + path, params=params, timeout=90)


def _post(demo: Demo, path: str, body: dict[str, Any], **params: Any) -> httpx.Response:
    return httpx.post(demo.api + path, json=body, params=params, timeout=90)


# -- 4. users and commands, the views filling in ------------------------------------------


def counts(demo: Demo, dsn: str) -> dict[str, int]:
    """What each view holds now, read from its store."""
    out = {"search": -1, "profile": -1, "timeline": -1, "mirror.public.users": -1}
    try:
        out["search"] = len(demo.views["search"].store.scan("posts"))
        out["profile"] = len(demo.views["profile"].store.scan("profiles"))
        schema = demo.settings.views_schema
        with psycopg.connect(dsn) as conn:
            for name, table in (("timeline", "timeline"), ("mirror.public.users", "public_users")):
                row = conn.execute(f"SELECT count(*) FROM {schema}.{table}").fetchone()
                out[name] = int(row[0]) if row else 0
    except Exception:
        pass
    return out


def progress_table(demo: Demo, dsn: str, sent: int, accepted: int) -> Table:
    table = Table(
        "view",
        "store",
        "holds",
        "lag (records)",
        title=f"{sent} commands sent, {accepted} accepted",
    )
    held = counts(demo, dsn)
    statuses = {
        st.view: st for st in view_statuses(list(demo.views.values()), demo.settings.kafka("demo"))
    }
    what = {
        "search": "posts indexed",
        "profile": "profiles",
        "timeline": "timeline rows",
        "mirror.public.users": "users",
    }
    for name, view in demo.views.items():
        st = statuses.get(name)
        holds = f"{held[name]} {what[name]}" if name in held else "-"
        table.add_row(name, view.store.kind, holds, "?" if st is None else str(st.lag))
    return table


def fill(demo: Demo, dsn: str) -> None:
    console, s = demo.console, demo.settings
    console.rule("4. users with plain SQL, then commands through Kafka and HTTP")
    from connectors.postgres import make_engine

    engine = make_engine(s.postgres())
    with engine.begin() as conn:
        for user_id, (handle, name) in enumerate(PEOPLE, start=1):
            upsert_user(
                conn,
                users_table(),
                user_id,
                handle,
                name,
                f"{name.split()[0]} writes about #{TOPICS[user_id % len(TOPICS)]}",
            )
    engine.dispose()
    console.print(f"  {len(PEOPLE)} users written to public.users")
    kafka = s.kafka("demo")
    topics = CommandTopics(s.commands_topic, s.command_results_topic, s.command_topic_partitions)
    ensure_topics(kafka, topics)
    client = CommandClient(kafka, topics)
    base = int(time.time()) % 100_000 * 1000  # post ids new on every run
    rng, users = demo.rng, list(range(1, len(PEOPLE) + 1))
    commands: list[tuple[str, dict[str, Any]]] = []
    for follower in users:
        for followee in rng.sample([u for u in users if u != follower], 5):
            commands.append(("FollowUser", {"follower_id": follower, "followee_id": followee}))
    for i in range(COMMANDS - len(commands)):
        words = rng.sample(TOPICS, 2)
        commands.append(
            (
                "CreatePost",
                {
                    "post_id": base + i,
                    "author_id": rng.choice(users),
                    "text": f"Thoughts on {words[0]} and #{words[1]}",
                },
            )
        )
    rng.shuffle(commands)
    accepted = 0
    over_http: list[Future[httpx.Response]] = []

    def answered() -> int:
        done = [f.result() for f in over_http if f.done()]
        return sum(r.status_code == 200 and r.json().get("status") == "accepted" for r in done)

    with (
        Live(progress_table(demo, dsn, 0, 0), console=console, refresh_per_second=2) as live,
        ThreadPoolExecutor(HTTP_CLIENTS, thread_name_prefix="demo-http") as http,
    ):
        for n, (kind, data) in enumerate(commands, start=1):
            if n % 10 == 0:  # every tenth command over HTTP (services send side by side)
                command = {"type": kind, "data": data}
                over_http.append(http.submit(_post, demo, "/commands", command))
            else:
                client.send(
                    kind,
                    data,
                    key=f"post-{data['post_id']}"
                    if "post_id" in data
                    else f"follows-{data['follower_id']}",
                )
                accepted += 1
            if n % 25 == 0:
                live.update(progress_table(demo, dsn, n, accepted + answered()))
        wait([*over_http])
        accepted += answered()
        posts = sum(1 for kind, _ in commands if kind == "CreatePost")
        # Lag 0 alone is not enough: a topic CDC has not created yet has no lag either.
        wait_for_demo(lambda: settled(demo, dsn, posts), 240, "the views to hold what was sent")
        live.update(progress_table(demo, dsn, len(commands), accepted))
    console.print()
    held = counts(demo, dsn)
    demo.check(
        "search index", held["search"] == posts, f"{held['search']} of {posts} posts indexed"
    )
    demo.check(
        "profile cache", held["profile"] == len(PEOPLE), f"{held['profile']} profiles in Redis"
    )
    demo.check(
        "home timeline", held["timeline"] > 0, f"{held['timeline']} timeline rows in PostgreSQL"
    )


def caught_up(demo: Demo) -> bool:
    statuses = view_statuses(list(demo.views.values()), demo.settings.kafka("demo"))
    return all(st.lag == 0 and st.error is None for st in statuses)


def settled(demo: Demo, dsn: str, posts: int) -> bool:
    """The views hold every post and user sent, and have nothing left to read."""
    held = counts(demo, dsn)
    people = len(PEOPLE)
    return (
        held["search"] == posts
        and held["profile"] == people
        and held["mirror.public.users"] == people
        and held["timeline"] > 0
        and caught_up(demo)
    )


# -- 5. a rename, a delete, a replay -------------------------------------------------------


def rename(demo: Demo, dsn: str) -> None:
    console = demo.console
    console.rule("5a. rename a user: search results follow")
    hits = _get(demo, "/search", q="thoughts", limit=50).json()
    author = next(h for h in hits if h["author_id"])["author_id"]
    old = _get(demo, f"/profile/{author}").json()
    new_handle, new_name = f"{old['handle']}-renamed", f"{old['display_name']} (renamed)"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE public.users SET handle = %s, display_name = %s WHERE id = %s",
            (new_handle, new_name, author),
        )
    console.print(f"  UPDATE public.users: {old['handle']} -> {new_handle}")
    started = time.monotonic()

    def follows() -> bool:
        found = _get(demo, "/search", q=new_handle, limit=100).json()
        return bool(found) and all(
            h["author_handle"] == new_handle for h in found if h["author_id"] == author
        )

    wait_for_demo(follows, 120, "search to show the new name")
    found = [
        h for h in _get(demo, "/search", q=new_handle, limit=100).json() if h["author_id"] == author
    ]
    table = Table("post", "author_handle", "author_name", "text")
    for h in found[:5]:
        table.add_row(str(h["post_id"]), h["author_handle"], h["author_name"], h["text"])
    console.print(table)
    demo.check(
        "rename reaches search",
        bool(found),
        f"{len(found)} posts re-indexed in {time.monotonic() - started:.1f}s",
    )


def delete(demo: Demo) -> None:
    console = demo.console
    console.rule("5b. delete a post: it leaves every timeline (read-your-writes)")
    followers = {
        u: _get(demo, f"/timeline/{u}", limit=100).json() for u in range(1, len(PEOPLE) + 1)
    }
    in_timelines: dict[int, list[int]] = {}
    for user, posts in followers.items():
        for post in posts:
            in_timelines.setdefault(post["post_id"], []).append(user)
    post_id, readers = max(in_timelines.items(), key=lambda kv: len(kv[1]))
    search = demo.views["search"].store
    indexed = search.get("posts", str(post_id)) is not None
    console.print(
        f"  post {post_id} is in {len(readers)} timelines; DeletePost over HTTP,"
        " waiting for the views"
    )
    done = _post(
        demo,
        "/commands",
        {"type": "DeletePost", "data": {"post_id": post_id}},
        wait_views="true",
        timeout=120,
    )
    result = done.json()
    token = result.get("position_token") or result.get("result", {}).get("position_token")
    still = [
        u
        for u in readers
        if any(
            p["post_id"] == post_id
            for p in _get(demo, f"/timeline/{u}", limit=100, min_position=token).json()
        )
    ]
    gone = indexed and search.get("posts", str(post_id)) is None
    demo.check(
        "delete leaves every timeline",
        done.status_code == 200 and not still,
        f"post {post_id}: in {len(still)} of {len(readers)} timelines after the delete"
        f" (token {token})",
    )
    demo.check("delete leaves search", gone, f"post {post_id} was indexed, is no longer")


def replay_profile(demo: Demo) -> None:
    console = demo.console
    console.rule("5c. replay the profile view from offset zero")
    view = demo.views["profile"]
    before = {e.key: dict(e.fields) for e in view.store.scan("profiles")}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "infra.cli", "replay", "profile"], check=False)
    after = {e.key: dict(e.fields) for e in view.store.scan("profiles")}
    same = done.returncode == 0 and after == before
    demo.check(
        "replay equals the live view",
        same,
        f"{len(after)} profiles rebuilt in {time.monotonic() - started:.0f}s,"
        f" identical: {after == before}",
    )


# -- 6. endpoints and summary --------------------------------------------------------------


def endpoints(demo: Demo) -> None:
    console, api = demo.console, demo.api
    console.rule("6. the HTTP API (while the parts run: `tributary run`)")
    sample = _get(demo, "/profile/1").json()
    for line in (
        f"curl '{api}/search?q=kafka&limit=3'",
        f"curl {api}/timeline/1",
        f"curl {api}/profile/1      # {json.dumps(sample)[:80]}",
        f"curl -X POST {api}/commands -H 'content-type: application/json'"
        f" -d '{json.dumps(COMMAND_EXAMPLE)}'",
        f"curl {api}/health",
        f"open {api}/docs",
    ):
        console.print(f"  {line}")


def summary(demo: Demo) -> None:
    table = Table("check", "result", "detail", title="summary")
    for c in demo.checks:
        table.add_row(c.name, "[green]ok[/]" if c.ok else "[red]FAILED[/]", c.detail)
    demo.console.print(table)
