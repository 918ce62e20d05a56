"""Several command processors (`tributary run commands`, each its own process) divide the
partitions of ``commands``: each partition has one owner, a joining processor takes a share, a
``kill -9``-ed one loses its partitions at once, a paused one (SIGSTOP) after the timeout and,
when it wakes (SIGCONT), its append and its results are refused by the fences (PostgreSQL's and
its partitions' transactional results producers). Every command is answered once
and stored once (checked against the event store), the topic's and those sent over HTTP
(`POST /commands` of `tributary serve`, beside the processors) alike."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from confluent_kafka import Producer
from sqlalchemy.engine import make_url

from connectors.kafka import TopicAdmin
from connectors.partition_owners import owners
from connectors.postgres import make_engine
from event_store import create_schema
from event_store.command_topic import CommandClient, CommandEnvelope, ensure_topics
from examples.social import prepare_database, upsert_user, users_table
from infra.command_results import Results
from infra.commands import command_topics, ownership_group
from infra.errors import WaitTimeoutError
from infra.polling import poll_until
from infra.settings import Settings, load_settings
from infra.stack.isolated import free_port_block
from tests.integration.conftest import Endpoints
from tests.integration.event_store.conftest import plain_text
from tests.integration.event_store.napping import napping_registry

ROOT = Path(__file__).resolve().parents[3]
PARTITIONS = 4


@dataclass
class Fleet:
    """The test's database, settings, and the processors it starts."""

    settings: Settings
    env: dict[str, str]
    dsn: str
    home: Path
    procs: list[subprocess.Popen[bytes]]

    def start(self) -> subprocess.Popen[bytes]:
        log = self.home / f"processor-{len(self.procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "infra.cli", "run", "commands", "--metrics-port", "0"],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
            for p in sorted(self.home.glob("processor-*.log"))
        )

    def start_two(self) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
        """Two processors, once they own two partitions each."""
        first, second = self.start(), self.start()
        poll_until(
            lambda: self.shares() == Counter({first.pid: 2, second.pid: 2}),
            120,
            "two processors owning two partitions each",
            0.25,
        )
        return first, second

    def owners(self) -> dict[int, tuple[int | None, int]]:
        """Each partition's owner (its pid, None when unowned) and epoch."""
        found = owners(self.dsn, ownership_group(self.settings))
        return {p: (_pid(member), epoch) for p, (member, epoch) in found.items()}

    def shares(self) -> Counter[int | None]:
        return Counter(pid for pid, _ in self.owners().values())


def _pid(member: str | None) -> int | None:
    return None if member is None else int(member.split(":")[-2])


@pytest.fixture
def fleet(
    request: pytest.FixtureRequest, stack: Endpoints, unique: str, tmp_path: Path
) -> Iterator[Fleet]:
    """Processors of a database of their own; ``request.param``: their timeout (seconds), or
    their timeout and their max poll interval."""
    timeout, max_poll = (
        request.param if isinstance(request.param, tuple) else (request.param, 300.0)
    )
    database = f"cp_{unique}"
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")  # type: ignore[arg-type]
    url = make_url(stack.database_url).set(database=database).render_as_string(False)
    values: dict[str, Any] = {
        "postgres_url": url,
        **stack.kafka_settings,
        "schema_registry_url": stack.settings.registry_url,
        "home": tmp_path / "home",
        "commands_topic": f"commands-{unique}",
        "command_results_topic": f"command-results-{unique}",
        "command_topic_partitions": PARTITIONS,
        "command_processor_name": f"cp-{unique}",
        "command_handlers": "tests.integration.event_store.napping:napping_registry",
        "command_owner_timeout_s": float(timeout),
        "command_max_poll_interval_s": float(max_poll),
        "command_results_exactly_once": True,
    }
    settings = load_settings(**values)
    env = {**os.environ, **{f"TRIBUTARY_{k.upper()}": str(v) for k, v in values.items()}}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    engine = make_engine(settings.postgres())
    with engine.begin() as conn:
        prepare_database(conn)
        create_schema(conn, settings.event_store_schema)
        for user in (1, 2, 3):
            upsert_user(conn, users_table(), user, f"u{user}")
    engine.dispose()
    kafka = settings.kafka("processors-test")
    ensure_topics(kafka, command_topics(settings))
    fleet = Fleet(settings, env, settings.postgres().dsn, tmp_path, [])
    try:
        yield fleet
    finally:
        for proc in fleet.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGTERM)
        for proc in fleet.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(30)
        TopicAdmin(kafka).delete(settings.commands_topic, settings.command_results_topic)
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {database} WITH (FORCE)")  # type: ignore[arg-type]


class Sender(threading.Thread):
    """CreatePost commands through the topic, about ``rate`` a second, until stopped."""

    def __init__(self, fleet: Fleet, rate: float = 25.0) -> None:
        super().__init__(name="sender", daemon=True)
        self.client = CommandClient(
            fleet.settings.kafka("processors-sender"),
            command_topics(fleet.settings),
            napping_registry(),
        )
        self.rate = rate
        self.sent: dict[str, int] = {}  # command id -> post id
        self.halt = threading.Event()
        self.errors: list[BaseException] = []

    def run(self) -> None:
        post = 1
        try:
            while not self.halt.is_set():
                data = {"post_id": post, "author_id": 1 + post % 3, "text": f"post {post}"}
                self.sent[self.client.send("CreatePost", data)] = post
                post += 1
                time.sleep(1 / self.rate)
        except BaseException as exc:  # surfaced by the test
            self.errors.append(exc)


class HttpSender(threading.Thread):
    """CreatePost commands through ``POST /commands`` of a ``tributary serve`` of the fleet's
    settings, one after another, until stopped; post ids from 1,000,000 up."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(name="http-sender", daemon=True)
        port = free_port_block(1)
        self.base = f"http://127.0.0.1:{port}"
        self.log = fleet.home / "serve.log"
        with open(self.log, "wb") as out:
            self.server = subprocess.Popen(
                [sys.executable, "-m", "infra.cli", "serve", "--port", str(port)],
                cwd=ROOT,
                env=fleet.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        fleet.procs.append(self.server)  # stopped with the processors
        self.sent: dict[str, int] = {}  # command id -> post id
        self.answers: dict[str, list[dict[str, Any]]] = {}  # command id -> its answers
        self.halt = threading.Event()
        self.errors: list[BaseException] = []

    def wait_up(self) -> None:
        def answers() -> bool:
            assert self.server.poll() is None, self.log.read_text()
            httpx.get(f"{self.base}/openapi.json", timeout=2)
            return True

        poll_until(answers, 60, "serve to answer", 0.2, retry_on=(httpx.TransportError,))

    def run(self) -> None:
        post = 1_000_000
        try:
            with httpx.Client(base_url=self.base, timeout=60) as client:
                while not self.halt.is_set():
                    command_id = str(uuid.uuid4())
                    data = {"post_id": post, "author_id": 1 + post % 3, "text": f"post {post}"}
                    body = {"command_id": command_id, "type": "CreatePost", "data": data}
                    answer = client.post("/commands", json=body)
                    assert answer.status_code == 200, answer.text
                    self.sent[command_id] = post
                    self.answers.setdefault(command_id, []).append(answer.json())
                    post += 1
                    time.sleep(0.05)
        except BaseException as exc:  # surfaced by the test
            self.errors.append(exc)


def _each_once(
    fleet: Fleet,
    results: Results,
    sent: dict[str, int],
    timeout: float,
    http: HttpSender | None = None,
) -> None:
    """Every command has exactly one result, accepted, and the event store holds exactly its
    events: one per post, version 1, the event ids its result names; nothing else. With
    ``http``: its commands too, each answered once over HTTP."""
    poll_until(
        lambda: set(sent) <= set(results.snapshot()),
        timeout,
        "a result for every command",
        0.5,
    )
    time.sleep(1.0)  # a second result would come now
    answers = results.snapshot()
    twice = {c: a for c, a in answers.items() if len(a) != 1}
    assert not twice, f"answered more than once: {list(twice.items())[:3]}"
    rejected = {c: a[0] for c, a in answers.items() if c in sent and a[0]["status"] != "accepted"}
    assert not rejected, list(rejected.items())[:3]
    schema = fleet.settings.event_store_schema
    with psycopg.connect(fleet.dsn) as conn:
        rows = conn.execute(
            f"SELECT stream_id, version, event_id::text, metadata->>'command_id'"  # type: ignore[arg-type]
            f" FROM {schema}.events"
        ).fetchall()
        recorded = conn.execute(f"SELECT count(*) FROM {schema}.commands").fetchone()  # type: ignore[arg-type]
    by_command = {str(c): (str(s), int(v), str(e)) for s, v, e, c in rows}
    assert len(by_command) == len(rows), "a command stored events twice"
    over_http = {} if http is None else http.sent
    assert sorted(s for s, _, _ in by_command.values()) == sorted(
        f"post-{p}" for p in (*sent.values(), *over_http.values())
    ), "streams differ from the commands sent"
    assert all(v == 1 for _, v, _ in by_command.values()), "a post stream beyond version 1"
    for command_id in sent:
        assert [by_command[command_id][2]] == answers[command_id][0]["event_ids"]
    if http is not None:
        assert not set(http.sent) & set(answers), "an HTTP command answered on the topic"
        for command_id in http.sent:
            [answer] = http.answers[command_id]
            assert answer["status"] == "accepted", answer
            assert [by_command[command_id][2]] == answer["event_ids"]
    assert recorded is not None and recorded[0] == len(sent) + len(over_http)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("fleet", [10.0], indirect=True)
def test_processors_divide_the_partitions_a_killed_one_and_a_paused_one_lose_their_share(
    fleet: Fleet,
) -> None:
    results = Results(fleet.settings, "processors-results", fetch_wait_ms=10)
    results.start()
    sender = Sender(fleet)
    http = HttpSender(fleet)
    try:
        first, second = fleet.start_two()
        http.wait_up()
        sender.start()
        http.start()
        time.sleep(2.0)
        third = fleet.start()
        poll_until(
            lambda: (
                sorted(fleet.shares().values()) == [1, 1, 2]
                and set(fleet.shares()) == {first.pid, second.pid, third.pid}
            ),
            120,
            "the joining processor taking a share",
            0.25,
        )
        time.sleep(2.0)
        shares = fleet.shares()
        victim = next(pid for pid in (first.pid, second.pid, third.pid) if shares[pid] == 2)
        before = fleet.owners()
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        poll_until(
            lambda: victim not in fleet.shares() and None not in fleet.shares(),
            30,
            "the killed processor's partitions owned by the others",
            0.1,
        )
        taken_s = time.monotonic() - killed
        after = fleet.owners()
        survivors = {first.pid, second.pid, third.pid} - {victim}
        assert set(fleet.shares()) == survivors and sorted(fleet.shares().values()) == [2, 2]
        for p, (pid, epoch) in before.items():
            if pid == victim:
                assert after[p][1] > epoch, f"partition {p} changed owner without a new epoch"
        print(f"partitions of the kill -9ed processor owned again after {taken_s:.2f} s")
        status = subprocess.run(  # what operators see: each partition's owner and epoch
            [sys.executable, "-m", "infra.cli", "status", "--json"],
            cwd=ROOT,
            env=fleet.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        [row] = [r for r in json.loads(status.stdout) if r["name"] == "commands"]
        shown = {int(p): (_pid(o["owner"]), o["epoch"]) for p, o in row["owners"].items()}
        assert shown == fleet.owners() and row["state"] == "2 processor(s)", row
        # the member's lock dies with it: no waiting out the 10 s timeout
        assert taken_s < fleet.settings.command_owner_timeout_s / 2, fleet.logs()
        time.sleep(2.0)
        # Then a survivor paused (SIGSTOP) past the timeout, under load: the other takes its
        # partitions; woken (SIGCONT), it is fenced (appends and results alike) and the
        # partitions are divided again.
        frozen, other = sorted(survivors)
        os.kill(frozen, signal.SIGSTOP)
        stopped = time.monotonic()
        poll_until(
            lambda: fleet.shares() == Counter({other: PARTITIONS}),
            60,
            "the paused processor's partitions owned by the other",
            0.1,
        )
        paused_s = time.monotonic() - stopped
        print(f"partitions of the paused processor owned again after {paused_s:.2f} s")
        assert paused_s > fleet.settings.command_owner_timeout_s / 2  # its lock stayed open
        os.kill(frozen, signal.SIGCONT)
        try:
            poll_until(
                lambda: fleet.shares() == Counter({frozen: 2, other: 2}),
                60,
                "the partitions divided again after the wake-up",
                0.25,
            )
        except WaitTimeoutError as exc:  # say what each processor did
            exits = {p.pid: p.poll() for p in fleet.procs}
            raise AssertionError(f"{exc}: {fleet.owners()} {exits}\n{fleet.logs()}") from exc
        time.sleep(2.0)
        sender.halt.set()
        http.halt.set()
        sender.join(30)
        http.join(90)
        assert not sender.errors, sender.errors
        assert not http.errors, (http.errors, http.log.read_text()[-2000:])
        assert len(sender.sent) > 100 and len(http.sent) > 20
        _each_once(fleet, results, sender.sent, 120, http)
    finally:
        sender.halt.set()
        http.halt.set()
        results.halt.set()


#: How the first processor stops making progress inside a command: frozen (SIGSTOP: its
#: heartbeat thread freezes too) with the result of the command before still in its producer,
#: or frozen after that result went out in its open transaction (``sent``: the woken
#: processor's commit of it would be refused: on Tansu a fenced producer's commit is not
#: refused but times out after 30 s), or hung in its handler while its heartbeat thread runs
#: on (it stops renewing after the max poll interval, 2 s here).
PAUSES = [
    pytest.param(3.0, "stopped", id="stopped"),
    pytest.param(3.0, "sent", id="stopped-after-a-result-went-out"),
    pytest.param((3.0, 2.0), "hung", id="hung"),
]


@pytest.mark.timeout(420)
@pytest.mark.parametrize(("fleet", "pause"), PAUSES, indirect=["fleet"])
def test_a_paused_processor_loses_its_partitions_and_its_append_is_refused_when_it_wakes(
    fleet: Fleet, pause: str, tmp_path: Path
) -> None:
    results = Results(fleet.settings, "processors-results", fetch_wait_ms=10)
    results.start()
    marks = tmp_path / "marks"
    marks.mkdir()
    topics = command_topics(fleet.settings)
    # Results wait in the producer until the end of their batch: the paused processor still
    # holds the result of the command before the nap when the new owner answers it. Or
    # (``sent``) they go out at once, in the batch's transaction, which it never commits.
    fleet.env["TRIBUTARY_COMMAND_RESULTS_LINGER_MS"] = "0" if pause == "sent" else "20000"
    stopped = pause in ("stopped", "sent")
    try:
        first, second = fleet.start_two()
        # A command, then one that naps 8 s in its handler, in one batch of one partition of
        # the first processor.
        partition = next(p for p, (pid, _) in sorted(fleet.owners().items()) if pid == first.pid)
        epoch = fleet.owners()[partition][1]
        before_id = f"before-{uuid.uuid4()}"
        nap_id = f"nap-{uuid.uuid4()}"
        data = {"post_id": 500, "author_id": 1, "nap_s": 8.0, "marks": str(marks)}
        # hung: the new owner must not hang too (it would lose the partition in turn)
        data["nap_once"] = pause == "hung"
        before = {"post_id": 501, "author_id": 2, "text": "post 501"}
        producer = Producer(fleet.settings.kafka("test-sender").client_properties())
        for key, envelope in (
            (b"post-501", CommandEnvelope(before_id, "CreatePost", before)),
            (b"post-500", CommandEnvelope(nap_id, "NapPost", data)),
        ):
            producer.produce(
                topics.commands, key=key, value=envelope.to_json(), partition=partition
            )
        assert producer.flush(30) == 0
        poll_until(
            lambda: (marks / f"500-{first.pid}").exists(), 60, "the first processor napping", 0.05
        )
        paused = time.monotonic()
        if stopped:
            os.kill(first.pid, signal.SIGSTOP)  # paused inside the command's transaction
        poll_until(
            lambda: fleet.owners()[partition][0] == second.pid,
            30,
            "the paused processor's partition taken over",
            0.1,
        )
        taken_s = time.monotonic() - paused
        assert fleet.owners()[partition][1] > epoch
        assert set(fleet.shares()) == {second.pid}  # every partition: the paused one owns none
        print(f"partitions of the paused processor owned by the other after {taken_s:.2f} s")
        # not at once: its connection (and lock) stayed open; the rows expired (the last
        # heartbeat was up to a quarter of the timeout before the pause; when hung, the
        # heartbeat stopped after the max poll interval)
        assert taken_s > fleet.settings.command_owner_timeout_s / 2
        if pause == "hung":
            assert first.poll() is None  # running all along: its heartbeat thread too
            assert taken_s > fleet.settings.command_max_poll_interval_s, fleet.logs()
            assert "no heartbeat until it does" in fleet.logs()
        poll_until(
            lambda: (marks / f"500-{second.pid}").exists(), 60, "the new owner napping", 0.05
        )
        if stopped:  # it wakes and commits before the new owner would
            os.kill(first.pid, signal.SIGCONT)
        answer = results.wait(nap_id, 60)
        assert answer is not None and answer["status"] == "accepted", (answer, fleet.logs())
        assert first.poll() is None, fleet.logs()  # refused, not crashed
        schema = fleet.settings.event_store_schema
        with psycopg.connect(fleet.dsn) as conn:
            texts = conn.execute(
                f"SELECT data->>'author_id', data->>'text' FROM {schema}.events"  # type: ignore[arg-type]
                " WHERE stream_id = 'post-500'"
            ).fetchall()
        engine = make_engine(fleet.settings.postgres())
        try:  # the text is personal: stored encrypted with the author's key
            plain = [(plain_text(engine, schema, int(a), t),) for a, t in texts]
        finally:
            engine.dispose()
        assert plain == [(f"handled by pid {second.pid}",)], (texts, fleet.logs())
        # the woken processor takes a share again; later commands are each handled once
        poll_until(
            lambda: fleet.shares() == Counter({first.pid: 2, second.pid: 2}),
            60,
            "the partitions divided again after the pause",
            0.25,
        )
        sender = Sender(fleet)
        sender.start()
        time.sleep(4.0)
        sender.halt.set()
        sender.join(30)
        assert not sender.errors, sender.errors
        # the result of the command before the nap, held by the paused processor's producer
        # when the new owner answered it (or sent in its open transaction), was refused when
        # it woke (the producer was fenced; the transaction never committed)
        _each_once(fleet, results, {**sender.sent, before_id: 501, nap_id: 500}, 120)
    finally:
        results.halt.set()
