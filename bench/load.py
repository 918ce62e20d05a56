"""Load: concurrent senders through the ``commands`` topic and ``POST /commands`` (not a test).

    .venv/bin/python bench/load.py [--senders 16] [--seconds 120] [--hot-posts 8]
        [--baseline-seconds 15]

Issue 13, item 5. Starts its own local stack (PostgreSQL, SeaweedFS + Tansu, Redis) on free
ports, then, as production runs them, the command processor (``CommandProcessor`` over the
bus ``tributary run-commands`` builds) and the HTTP API (``create_app`` under uvicorn, without
views), each in a child process. Half the senders produce to the ``commands`` topic and wait
for their result on ``command-results``; the other half ``POST /commands``. Closed loop: each
sender sends its next command once it has the last one's answer.

The workload contends on purpose: likes and edits of a few hot posts (the processor and the
HTTP API write the same streams: conflicts), new posts, follows and unfollows of 16 users
(some rejected: "already follows"). Checked at the end, and printed with the figures:

- every command got exactly one result (topic: one record per command id on
  ``command-results``; HTTP: one answer per request), none lost, none twice;
- no version gaps: every stream's versions run 1..n; the events stored are exactly those the
  accepted results name;
- conflicts surfaced as retries (the bus's append attempts beyond the accepted appends, per
  child) or as rejections ("gave up after retries"), never as errors;
- the processor never exited (no poison loop, no restart).

Baselines, measured in the same run before the load (``bench/load_baseline.py``), each
path's transport without command handling, driven by the same senders (the same split, the
same client code and settings), both paths at once as in the load, ``--baseline-seconds``:

- topic path: a plain echo on the same broker. The senders produce to a request topic with
  ``CommandClient`` and wait on a ``command-results``-like reply topic with the load's own
  reader (``infra.command_results.Results``); an echo child (confluent-kafka consumer and
  producer with the processor's properties and batch loop, no event store, no bus) answers
  each record. The ratio isolates the processor's own cost (the bus, PostgreSQL, the
  position save).
- HTTP path: the same HTTP API (``create_app`` under the same uvicorn config, in a child)
  over a bus that routes the command and answers ``accepted`` without touching PostgreSQL.
  Chosen over the store's direct append rate: it is the HTTP path minus exactly the command
  handling, as the echo is the topic path minus it, so both ratios read the same way (the
  store against pgbench is ``bench/append.py``'s and ``bench/commands.py``'s).

Printed: each path's commands/s over its baseline's round trips/s and its p50 over the
baseline's p50, and where the topic path's p50 goes: the send alone (produce, flushed), the
echo's round trip, and the echo again with a reply reader whose ``fetch.wait.max.ms`` is
10 ms instead of librdkafka's default 500 ms, which the load's reader uses (Tansu holds a
fetch for its whole wait even when records are there, ``connectors/kafka/fetching.py``).
Measured (16 senders, 10 s load, 8 s baselines, a shared 2-core machine): the echo alone
ran 17.8 round trips/s at p50 255 ms, p95 1,320 ms (with a 10 ms reply reader: 31.8/s, p50
102 ms); the topic path's 10.6/s was 0.59x the echo's rate and its p50 (307 ms) 1.20x the
echo's: the broker round trip itself is slow, the processor adds about a sixth of the p50.
The HTTP path's 280/s was 0.25x the no-store API's 1,127/s, its p50 (20.8 ms) 4.06x.

The views are not run here (no Spark): their convergence under load is the chaos harness's
job (``tests/chaos``).
"""

import argparse
import multiprocessing as mp
import random
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import text

from bench.load_baseline import (
    LIBRDKAFKA_DEFAULT_FETCH_WAIT_MS,
    Figures,
    echo_settings,
    run_echo,
    run_no_store_api,
)
from bench.stopping import stop_cleanly_on_sigterm
from connectors.kafka.reading import read_topic
from connectors.postgres import make_engine
from event_store.command_topic import PROCESSOR_FETCH_WAIT_MS, CommandClient, ensure_topics
from examples.social import upsert_user, users_table
from infra.command_results import Results
from infra.commands import command_topics
from infra.settings import Settings
from infra.stack import LocalStack
from infra.stack.isolated import isolated_settings

USERS = 16


# -- the children: the processor and the HTTP API, as production runs them ----------------


def _bus(settings: Settings) -> Any:
    from infra.commands import command_bus, load_registry, prepare_database

    registry, module = load_registry(settings.command_handlers)
    engine = make_engine(settings.postgres())
    prepare_database(settings, engine, module)
    return command_bus(settings, engine, registry)


def run_processor(settings: Settings, out: Any) -> None:
    from event_store.command_topic import CommandProcessor

    bus = _bus(settings)
    processor = CommandProcessor(
        bus, settings.kafka("load-processor"), command_topics(settings), "load-processor"
    )
    signal.signal(signal.SIGTERM, lambda *_: processor.stop())
    try:
        processor.run()
    finally:
        out.put(("topic", processor.handled, bus.attempts))


def run_http(settings: Settings, port: int, out: Any) -> None:
    import uvicorn

    from infra.http_api import create_app

    bus = _bus(settings)
    app = create_app(settings, views=[], bus=bus)
    uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")).run()
    out.put(("http", None, bus.attempts))


# -- the senders --------------------------------------------------------------------------


@dataclass
class Sent:
    path: str  # "topic" or "http"
    command_id: str
    type: str
    latency: float
    answer: dict[str, Any]  # the result's JSON, or {"status": "http <code>", ...}
    produce: float = 0.0  # topic: the send (produce, flushed: acknowledged) alone


@dataclass
class Tally:
    sent: list[Sent] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, item: Sent) -> None:
        with self.lock:
            self.sent.append(item)


def command(rng: random.Random, hot: int, new_post: Any) -> tuple[str, dict[str, Any]]:
    draw = rng.random()
    user = rng.randint(1, USERS)
    if draw < 0.35:
        return "LikePost", {"post_id": rng.randint(1, hot), "user_id": user}
    if draw < 0.65:
        return "EditPost", {"post_id": rng.randint(1, hot), "text": f"edit {rng.random():.6f}"}
    if draw < 0.85:
        return "CreatePost", {"post_id": new_post(), "author_id": user, "text": "load #test"}
    other = rng.choice([u for u in range(1, USERS + 1) if u != user])
    kind = "FollowUser" if rng.random() < 0.6 else "UnfollowUser"
    return kind, {"follower_id": user, "followee_id": other}


def topic_sender(
    n: int, settings: Settings, results: Results, tally: Tally, until: float, hot: int, ids: Any
) -> None:
    rng = random.Random(n)
    client = CommandClient(settings.kafka(f"load-sender-{n}"), command_topics(settings))
    while time.monotonic() < until:
        kind, data = command(rng, hot, ids)
        command_id = f"t{n}-{uuid.uuid4()}"
        key = f"post-{data['post_id']}" if "post_id" in data else f"follows-{data['follower_id']}"
        started = time.monotonic()
        client.send(kind, data, command_id=command_id, key=key)
        produced = time.monotonic() - started
        answer = results.wait(command_id, 120) or {"status": "no result within 120 s"}
        tally.add(Sent("topic", command_id, kind, time.monotonic() - started, answer, produced))


def http_sender(n: int, base: str, tally: Tally, until: float, hot: int, ids: Any) -> None:
    import httpx

    rng = random.Random(1000 + n)
    with httpx.Client(base_url=base, timeout=60) as client:
        while time.monotonic() < until:
            kind, data = command(rng, hot, ids)
            command_id = f"h{n}-{uuid.uuid4()}"
            started = time.monotonic()
            try:
                response = client.post(
                    "/commands", json={"command_id": command_id, "type": kind, "data": data}
                )
                answer = (
                    response.json()
                    if response.status_code == 200
                    else {
                        "status": f"http {response.status_code}",
                        "reason": response.text[:200],
                    }
                )
            except httpx.HTTPError as exc:
                answer = {"status": f"transport error {type(exc).__name__}"}
            tally.add(Sent("http", command_id, kind, time.monotonic() - started, answer))


# -- the run ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_http(base: str, child: Any) -> None:
    import httpx

    deadline = time.monotonic() + 90
    while True:
        if not child.is_alive():
            raise RuntimeError(f"the HTTP API exited with {child.exitcode}")
        try:
            httpx.get(f"{base}/health", timeout=2)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise RuntimeError("the HTTP API did not answer within 90 s") from None
            time.sleep(0.3)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def figures(tally: Tally, path: str, elapsed: float) -> Figures:
    mine = [s for s in tally.sent if s.path == path]
    lat = [s.latency * 1000 for s in mine]
    produce = [s.produce * 1000 for s in mine]
    return Figures(len(lat), elapsed, pct(lat, 0.5), pct(lat, 0.95), pct(produce, 0.5))


def drive(
    senders: int,
    seconds: float,
    topic: tuple[Settings, Results],
    base: str,
    hot: int,
    new_post: Any,
) -> tuple[Tally, float]:
    """The load's senders, closed loop, for ``seconds``: even ones through ``topic``
    (settings whose topics they produce to, the reader they wait on), odd ones POSTing to
    ``base``. Returns what they sent and the time it took."""
    tally = Tally()
    started = time.monotonic()
    until = started + seconds
    threads = []
    for n in range(senders):
        if n % 2 == 0:
            target: Any = topic_sender
            targs: tuple[Any, ...] = (n, topic[0], topic[1], tally, until, hot, new_post)
        else:
            target = http_sender
            targs = (n, base, tally, until, hot, new_post)
        threads.append(threading.Thread(target=target, args=targs, daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return tally, time.monotonic() - started


def baselines(settings: Settings, args: Any, ctx: Any) -> dict[str, Figures]:
    """The transport of each path without command handling, with the load's senders (the
    same split, the same client code): the broker echo and the no-store HTTP API, at once
    as the load runs its two paths. Twice: with the load's reply reader, then with a reader
    whose fetch wait is 10 ms (a diagnostic of the reader)."""
    echo = echo_settings(settings)
    ensure_topics(echo.kafka("load-admin"), command_topics(echo))
    out = ctx.Queue()
    port = free_port()
    echoer = ctx.Process(target=run_echo, args=(echo, out), name="echo")
    api = ctx.Process(target=run_no_store_api, args=(settings, port), name="no-store-api")
    echoer.start()
    api.start()
    base = f"http://127.0.0.1:{port}"
    counter = iter(range(10_000, 10**9))
    lock = threading.Lock()

    def new_post() -> int:
        with lock:
            return next(counter)

    found: dict[str, Figures] = {}
    try:
        wait_http(base, api)
        for label, wait_ms in (("", None), (" 10ms", 10)):
            reader = Results(echo, f"load-echo-replies{label.strip()}", wait_ms)
            reader.start()
            warm = CommandClient(echo.kafka("load-echo-warm"), command_topics(echo))
            warmed = reader.wait(warm.send("Echo", {}), 120)  # the echo's first assignment
            assert warmed is not None, "the echo did not answer within 120 s"
            tally, elapsed = drive(
                args.senders, args.baseline_seconds, (echo, reader), base, args.hot_posts, new_post
            )
            reader.halt.set()
            reader.join(10)
            unanswered = [s.command_id for s in tally.sent if s.answer.get("status") != "accepted"]
            if unanswered:
                print(f"echo{label}: {len(unanswered)} round trips got no answer within 120 s")
                trace_missing(echo, None, unanswered[:5])
            found[f"echo{label}"] = figures(tally, "topic", elapsed)
            found[f"api{label}"] = figures(tally, "http", elapsed)
    finally:
        for child in (echoer, api):
            if child.is_alive():
                child.terminate()
            child.join(30)
            if child.is_alive():
                child.kill()
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--senders", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--hot-posts", type=int, default=8)
    parser.add_argument(
        "--baseline-seconds", type=float, default=15, help="duration of each baseline phase"
    )
    args = parser.parse_args()
    settings = isolated_settings("tributary-load-")
    stack = LocalStack(settings)
    t0 = time.monotonic()
    stack.up()
    print(f"stack up in {time.monotonic() - t0:.1f} s", flush=True)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    children: list[Any] = []
    try:
        engine = make_engine(settings.postgres())
        topics = command_topics(settings)
        ensure_topics(settings.kafka("load-admin"), topics)
        t0 = time.monotonic()
        base_figures = baselines(settings, args, ctx)
        print(f"baselines measured in {time.monotonic() - t0:.1f} s:", flush=True)
        for label, fig in base_figures.items():
            print(
                f"  {label:9} {fig.count:6} round trips {fig.rate:6.0f}/s  latency ms "
                f"p50 {fig.p50:.1f} p95 {fig.p95:.1f}"
                + (f"  (the send alone p50 {fig.produce_p50:.1f})" if fig.produce_p50 else ""),
                flush=True,
            )
        processor = ctx.Process(target=run_processor, args=(settings, out), name="processor")
        processor.start()
        children.append(processor)
        port = free_port()
        http = ctx.Process(target=run_http, args=(settings, port, out), name="http")
        http.start()
        children.append(http)
        base = f"http://127.0.0.1:{port}"
        wait_http(base, http)
        with engine.begin() as conn:  # the processor's child created the tables by now
            for user_id in range(1, USERS + 1):
                upsert_user(conn, users_table(), user_id, f"user{user_id}", f"User {user_id}")
        results = Results(settings, "load-results")
        results.start()
        import httpx

        setup_events: set[str] = set()
        for post_id in range(1, args.hot_posts + 1):  # the hot posts, through HTTP
            data = {"post_id": post_id, "author_id": 1, "text": "hot"}
            answer = httpx.post(
                f"{base}/commands", json={"type": "CreatePost", "data": data}, timeout=60
            ).json()
            assert answer["status"] == "accepted", answer
            setup_events.update(answer["event_ids"])
        counter = iter(range(10_000, 10**9))
        counter_lock = threading.Lock()

        def new_post() -> int:
            with counter_lock:
                return next(counter)

        # warm the processor (its first assignment and batch) before the clock starts
        warm = CommandClient(settings.kafka("load-warm"), topics)
        warm_id = warm.send("FollowUser", {"follower_id": 1, "followee_id": 2})
        warmed = results.wait(warm_id, 120)
        assert warmed is not None and warmed["status"] == "accepted", warmed
        setup_events.update(warmed["event_ids"])

        tally = Tally()
        started = time.monotonic()
        until = started + args.seconds
        threads = []
        for n in range(args.senders):
            if n % 2 == 0:
                target: Any = topic_sender
                targs: tuple[Any, ...] = (
                    n,
                    settings,
                    results,
                    tally,
                    until,
                    args.hot_posts,
                    new_post,
                )
            else:
                target = http_sender
                targs = (n, base, tally, until, args.hot_posts, new_post)
            threads.append(threading.Thread(target=target, args=targs, daemon=True))
        for thread in threads:
            thread.start()
        alive_throughout = True
        while any(t.is_alive() for t in threads):
            alive_throughout &= processor.is_alive() and http.is_alive()
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        time.sleep(3)  # late duplicates would show up here
        results.halt.set()
        results.join(10)
        report(settings, engine, tally, results, elapsed, alive_throughout, warm_id, setup_events)
        report_ratios(tally, elapsed, base_figures)
        for child in children:
            if child.is_alive():
                child.terminate()  # SIGTERM: both stop gracefully and report
        attempts = {}
        for _ in children:
            try:
                path, _handled, tried = out.get(timeout=60)
                attempts[path] = tried
            except Exception:
                break
        accepted_appends = Counter(
            s.path
            for s in tally.sent
            if s.answer.get("status") == "accepted" and s.answer.get("event_ids")
        )
        # the hot posts (HTTP) and the warm-up follow (topic) were appends too
        accepted_appends["http"] += args.hot_posts
        accepted_appends["topic"] += 1
        for path, tried in sorted(attempts.items()):
            retries = tried - accepted_appends[path]
            print(
                f"{path}: append attempts {tried}, accepted appends {accepted_appends[path]}, "
                f"retries after a conflict {retries}"
            )
    finally:
        for child in children:
            child.join(30)
            if child.is_alive():
                child.kill()
        stack.down()
        shutil.rmtree(settings.home.parent, ignore_errors=True)


def report(
    settings: Settings,
    engine: Any,
    tally: Tally,
    results: Results,
    elapsed: float,
    alive: bool,
    warm_id: str,
    setup_events: set[str],
) -> None:
    sent = tally.sent
    print(f"\n{len(sent)} commands in {elapsed:.1f} s = {len(sent) / elapsed:.0f} commands/s")
    for path in ("topic", "http"):
        mine = [s for s in sent if s.path == path]
        lat = [s.latency * 1000 for s in mine]
        statuses = Counter(s.answer.get("status") for s in mine)
        print(
            f"  {path:5} {len(mine):6} commands {len(mine) / elapsed:6.0f}/s  latency ms "
            f"p50 {pct(lat, 0.5):.1f} p95 {pct(lat, 0.95):.1f} p99 {pct(lat, 0.99):.1f} "
            f"max {max(lat, default=0):.1f}  {dict(statuses)}"
        )
    reasons = Counter(
        _reason_kind(str(s.answer.get("reason", "")))
        for s in sent
        if s.answer.get("status") == "rejected"
    )
    print(f"  rejections by reason: {dict(reasons)}")
    by_type = Counter((s.type, s.answer.get("status")) for s in sent)
    print(f"  by type and status: {dict(sorted(by_type.items()))}")

    topic_ids = {s.command_id for s in sent if s.path == "topic"} | {warm_id}
    missing = [i for i in topic_ids if not results.by_id.get(i)]
    twice = {i: len(r) for i, r in results.by_id.items() if len(r) > 1}
    strangers = set(results.by_id) - topic_ids
    http_ids = [s.command_id for s in sent if s.path == "http"]
    odd = [s for s in sent if s.answer.get("status") not in ("accepted", "rejected")]
    print(
        f"exactly one result: topic missing {len(missing)}, more than one {len(twice)}, "
        f"results for unknown ids {len(strangers)}; HTTP answers {len(http_ids)} for "
        f"{len(set(http_ids))} ids; answers neither accepted nor rejected: {len(odd)}"
    )
    for s in odd[:5]:
        print(f"    {s.path} {s.type}: {s.answer}")
    if missing:
        trace_missing(settings, engine, missing[:5])

    accepted_events = setup_events | {
        e for s in sent if s.answer.get("status") == "accepted" for e in s.answer["event_ids"]
    }
    schema = settings.event_store_schema
    with engine.connect() as conn:
        gaps = conn.execute(
            text(
                f"SELECT stream_id, count(*), min(version), max(version) FROM {schema}.events "
                "GROUP BY stream_id HAVING min(version) <> 1 OR max(version) <> count(*) "
                "OR count(DISTINCT version) <> count(*)"
            )
        ).all()
        stored = {str(r[0]) for r in conn.execute(text(f"SELECT event_id FROM {schema}.events"))}
        streams = conn.execute(
            text(f"SELECT count(DISTINCT stream_id), max(version) FROM {schema}.events")
        ).one()
        recorded = conn.execute(text(f"SELECT count(*) FROM {schema}.commands")).scalar_one()
    sent_ids = {s.command_id for s in sent}
    unexplained = stored - accepted_events
    print(
        f"store: {len(stored)} events in {streams[0]} streams (longest {streams[1]} versions), "
        f"{recorded} commands recorded; version gaps or duplicates in {len(gaps)} streams; "
        f"accepted events missing from the store {len(accepted_events - stored)}; "
        f"stored events no accepted result names {len(unexplained)}"
    )
    print(f"processor and HTTP API alive throughout: {alive}; distinct ids sent {len(sent_ids)}")


def trace_missing(settings: Settings, engine: Any | None, missing: list[str]) -> None:
    """Where the answer of a command without a result was lost: whether the command is on
    ``commands``, whether the processor recorded a result (``engine``: its database), whether
    that result is on ``command-results`` (read whole again, apart from the load's reader)."""
    topics = command_topics(settings)
    kafka = settings.kafka("load-trace")
    commands = [r.value or b"" for r in read_topic(kafka, topics.commands)]  # keyed by stream
    on_results = {(r.key or b"").decode() for r in read_topic(kafka, topics.results)}
    schema = settings.event_store_schema
    for command_id in missing:
        row = None
        if engine is not None:
            with engine.connect() as conn:
                row = conn.execute(
                    text(f"SELECT result FROM {schema}.commands WHERE command_id = :id"),
                    {"id": command_id},
                ).first()
        print(
            f"    missing {command_id}: on {topics.commands} "
            f"{any(command_id.encode() in value for value in commands)}; "
            f"recorded {row[0] if row else None}; on {topics.results} {command_id in on_results}"
        )


def report_ratios(tally: Tally, elapsed: float, base: dict[str, Figures]) -> None:
    """Each path against its baseline of this run; the broker round trip's own share."""
    print(
        "\nratios to the baselines of this run (the same senders and clients, no command "
        "handling): rate / baseline rate (higher is better), p50 / baseline p50 (lower is better)"
    )
    for path, label, name in (
        ("topic", "echo", "broker echo"),
        ("http", "api", "no-store HTTP API"),
    ):
        mine, theirs = figures(tally, path, elapsed), base[label]
        print(
            f"  {path:5} {mine.rate:6.1f}/s / {name} {theirs.rate:6.1f}/s = "
            f"{mine.rate / theirs.rate:.2f}   p50 {mine.p50:.1f} ms / {theirs.p50:.1f} ms = "
            f"{mine.p50 / theirs.p50:.2f}   (p95 {mine.p95:.1f} / {theirs.p95:.1f} ms)"
        )
    echo, fast = base["echo"], base["echo 10ms"]
    topic = figures(tally, "topic", elapsed)
    print(
        f"  topic path p50 {topic.p50:.1f} ms: the send alone (produced, acknowledged) "
        f"p50 {topic.produce_p50:.1f} ms (echo {echo.produce_p50:.1f}); the bare broker round "
        f"trip (echo) p50 {echo.p50:.1f} ms = {echo.p50 / topic.p50:.2f} of it, the rest is "
        "the processor's own"
    )
    print(
        f"  the reply reader's fetch wait (fetch.wait.max.ms {LIBRDKAFKA_DEFAULT_FETCH_WAIT_MS}, "
        "librdkafka's default, which Tansu holds in full): with a reader at 10 ms the echo's "
        f"p50 is {fast.p50:.1f} ms (p95 {fast.p95:.1f}), {fast.rate:.1f}/s = "
        f"{fast.rate / echo.rate:.2f}x the echo's rate"
    )
    if echo.p50 > topic.p50 / 2:
        print(
            "  the broker round trip itself is slow: the echo, with no command handling, takes "
            f"{echo.p50 / topic.p50:.0%} of the topic path's p50 (each round trip waits on "
            f"two fetches Tansu holds for their whole wait: the processor's consumer "
            f"{PROCESSOR_FETCH_WAIT_MS} ms at first, the reply reader's)"
        )


def _reason_kind(reason: str) -> str:
    for words in (
        "gave up after retries",
        "already follows",
        "does not follow",
        "already liked",
        "already",
        "cannot store",
        "handling the command failed",
    ):
        if words in reason:
            return words
    return reason[:40]


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
