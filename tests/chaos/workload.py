"""The steady workload of the chaos harness: commands through the topic and HTTP, SQL writes.

Every sender is a patient client: it re-sends a command with the same command id until it
has an answer (the bus answers a known command id with its first result), so a command lost
by a crash is re-sent, and a command handled twice would show as events stored twice.
"""

import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg

from event_store.command_topic import CommandClient
from infra.command_results import Results
from infra.commands import command_topics
from infra.settings import Settings
from tests.chaos.compare import Answer

USERS = 20  # written by SQL before the workload starts; the SQL writer adds more
RESEND_AFTER_S = 20.0


@dataclass
class Workload:
    """Senders and the SQL writer; ``pause()`` lets every command in flight get its answer."""

    s: Settings
    api: str
    results: Results
    topic_senders: int = 2
    http_senders: int = 2
    pace_s: float = 0.3
    answers: dict[str, Answer] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    running: threading.Event = field(default_factory=threading.Event)
    halt: threading.Event = field(default_factory=threading.Event)
    busy: int = 0
    next_post: int = 1
    next_user: int = USERS + 1
    posts: list[int] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        self.running.set()
        for n in range(self.topic_senders):
            self._thread(f"topic-{n}", self._topic_sender, n)
        for n in range(self.http_senders):
            self._thread(f"http-{n}", self._http_sender, n)
        self._thread("sql", self._sql_writer, 0)

    def scale(self, topic_senders: int, http_senders: int, pace_s: float) -> None:
        """Run this many senders of each kind (more start; the extra ones end after their turn)."""
        with self.lock:
            before = (self.topic_senders, self.http_senders)
            self.topic_senders, self.http_senders, self.pace_s = (
                topic_senders,
                http_senders,
                pace_s,
            )
        for n in range(before[0], topic_senders):
            self._thread(f"topic-{n}", self._topic_sender, n)
        for n in range(before[1], http_senders):
            self._thread(f"http-{n}", self._http_sender, n)

    def _thread(self, name: str, target: Callable[[int], None], n: int) -> None:
        thread = threading.Thread(target=target, args=(n,), name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def pause(self, timeout: float = 600.0) -> None:
        """Stop starting new work; wait until every command in flight has its answer."""
        self.running.clear()
        deadline = time.monotonic() + timeout
        while self.busy and time.monotonic() < deadline:
            time.sleep(0.2)

    def resume(self) -> None:
        self.running.set()

    def stop(self) -> None:
        self.pause()
        self.halt.set()
        self.running.set()  # wake the waiting threads so they see the halt
        for thread in self.threads:
            thread.join(60)

    def _turn(self, sender: tuple[str, int] | None = None) -> bool:
        """Wait while paused; False once halted (or this sender is beyond the senders wanted).
        Counts this thread busy when True."""
        while not self.running.wait(0.5):
            if self.halt.is_set():
                return False
        if self.halt.is_set():
            return False
        if sender is not None:
            kind, n = sender
            if n >= (self.topic_senders if kind == "topic" else self.http_senders):
                return False
        with self.lock:
            self.busy += 1
        return True

    def _done(self, command_id: str | None, result: dict[str, Any] | None) -> None:
        with self.lock:
            self.busy -= 1
            if command_id is not None:
                self.answers[command_id] = Answer(command_id, result)
        time.sleep(self.pace_s)

    def _command(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
        draw = rng.random()
        with self.lock:
            users, known = self.next_user - 1, list(self.posts[-200:])
        user = rng.randint(1, min(users, 200))
        if draw < 0.4 or not known:
            with self.lock:
                post_id = self.next_post
                self.next_post += 1
                self.posts.append(post_id)
            text = f"chaos #{rng.choice(['kafka', 'spark', 'cdc'])} {rng.random():.5f}"
            return "CreatePost", {"post_id": post_id, "author_id": user, "text": text}
        if draw < 0.55:
            return "EditPost", {"post_id": rng.choice(known), "text": f"edit #x {rng.random():.5f}"}
        if draw < 0.65:
            return "DeletePost", {"post_id": rng.choice(known)}
        other = rng.randint(1, USERS)
        if other == user:
            other = other % USERS + 1
        kind = "FollowUser" if draw < 0.9 else "UnfollowUser"
        return kind, {"follower_id": user, "followee_id": other}

    def _topic_sender(self, n: int) -> None:
        rng = random.Random(n)
        client = CommandClient(self.s.kafka(f"chaos-sender-{n}"), command_topics(self.s))
        while self._turn(("topic", n)):
            kind, data = self._command(rng)
            command_id = f"t{n}-{uuid.uuid4()}"
            key = (
                f"post-{data['post_id']}" if "post_id" in data else f"follows-{data['follower_id']}"
            )
            result = None
            while result is None and not self.halt.is_set():
                try:
                    client.send(kind, data, command_id=command_id, key=key)
                except Exception as exc:  # broker down: try again with the same id
                    self._error(f"topic send: {type(exc).__name__}: {exc}")
                    time.sleep(1)
                    continue
                result = self.results.wait(command_id, RESEND_AFTER_S)
            self._done(command_id, result)

    def _http_sender(self, n: int) -> None:
        rng = random.Random(1000 + n)
        with httpx.Client(base_url=self.api, timeout=60) as client:
            while self._turn(("http", n)):
                kind, data = self._command(rng)
                command_id = f"h{n}-{uuid.uuid4()}"
                result = None
                while result is None and not self.halt.is_set():
                    result = post_command(client, command_id, kind, data, self._error)
                self._done(command_id, result)

    def _sql_writer(self, _: int) -> None:
        rng = random.Random(7)
        while self._turn():
            try:
                with psycopg.connect(
                    self.s.postgres().dsn, autocommit=True, connect_timeout=5
                ) as c:
                    if rng.random() < 0.2:
                        with self.lock:
                            user_id = self.next_user
                        add_user(c, user_id)
                        with self.lock:
                            self.next_user += 1
                    else:
                        with self.lock:
                            user_id = rng.randint(1, self.next_user - 1)
                        c.execute(
                            "UPDATE public.users SET display_name = %s, bio = %s,"
                            " updated_at = now() WHERE id = %s",
                            (
                                f"User {user_id} {rng.random():.5f}",
                                f"bio {rng.random():.5f}",
                                user_id,
                            ),
                        )
            except psycopg.Error as exc:  # the database is down: the next turn tries again
                self._error(f"sql: {type(exc).__name__}: {exc}")
                time.sleep(1)
            self._done(None, None)

    def _error(self, line: str) -> None:
        with self.lock:
            self.errors.append(line)


def post_command(
    client: httpx.Client,
    command_id: str,
    kind: str,
    data: dict[str, Any],
    on_error: Callable[[str], None],
) -> dict[str, Any] | None:
    """One POST /commands; the result, or None (after a pause) when it must be sent again."""
    try:
        response = client.post(
            "/commands", json={"command_id": command_id, "type": kind, "data": data}
        )
    except httpx.HTTPError as exc:
        on_error(f"http: {type(exc).__name__}")
        time.sleep(1)
        return None
    if response.status_code == 200:
        answer: dict[str, Any] = response.json()
        return answer
    on_error(f"http {response.status_code}: {response.text[:200]}")
    if 400 <= response.status_code < 500 and response.status_code not in (408, 429):
        return {"status": f"http {response.status_code}", "reason": response.text[:200]}
    time.sleep(1)
    return None


def add_user(conn: psycopg.Connection[Any], user_id: int) -> None:
    conn.execute(
        "INSERT INTO public.users (id, handle, display_name, bio) VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (id) DO NOTHING",
        (user_id, f"user{user_id}", f"User {user_id}", f"bio of {user_id}"),
    )
