"""Benchmark: how long a command takes to be visible in each view (not a test).

    .venv/bin/python bench/latency.py [--commands 1000] [--rate 20] [--trigger 1.0] [--senders 16]
        [--broker-storage s3|memory]

Starts its own local stack and the long-running parts (CDC, the command processor, the views:
search, profile, timeline and the users mirror) under the supervisor, creates users, then
sends commands at a steady rate through the ``commands`` topic (posts, edits, follows), from
``--senders`` threads (each send waits for the broker's acknowledgement, so one thread alone
cannot send faster than one broker round trip each; a key's commands go from one thread, in
order), and prints the rate it reached. For
each accepted command it measures, from the moment it was sent:

- ``broker`` (the baseline): a record produced (idempotent, flushed) to a probe topic at the
  same rate by a process of its own, until a tail sees it: the broker's latency under the same
  load, with nothing of Tributary in the path;
- ``result``: its result on ``command-results``;
- ``kafka``: its event on ``events.<type>`` (published by CDC from the event store);
- one figure per view: the first moment the view's store had committed past that event's
  offset (what a reader of the store sees), polled every 20 ms from the stores' ledgers.

The moments are taken in three recorder processes (the two topics' tails and the stores'
poller), apart from the process that sends: measured in one process, the poller and the tails
waited on each other and on the sender for the interpreter lock, and the figures grew with it
(results were seen later than the events they produced).

Prints p50 / p95 / p99 / max per stage, each p50 as a ratio to the broker's, and the aim
(p50 < 1 s, p99 < 2 s per view); then, per view, the mean time of each of Spark's trigger phases
and of the batches' fold and write, read from the views process's metrics at the end.
"""

import argparse
import multiprocessing
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import cpu
from bench.stopping import stop_cleanly_on_sigterm
from connectors.kafka import KafkaConfig, TopicAdmin
from connectors.kafka.following import Follower
from connectors.kafka.offsets import probe_consumer, true_watermarks
from connectors.kafka.producing import idempotent_producer
from connectors.kafka.topics import TopicSpec
from connectors.postgres import make_engine
from event_store import create_schema
from event_store.command import Accepted, result_from_json
from event_store.command_topic import CommandClient, CommandTopics, ensure_topics
from examples.social import prepare_database, upsert_user, users_table
from infra.settings import Settings, load_settings
from infra.stack import LocalStack
from infra.stack.isolated import isolated_settings, settings_env
from infra.supervision import Supervisor
from infra.views import views_config
from views.catalog import configured_views

USERS = 60


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def record_tail(
    kafka: KafkaConfig, topics: list[str], kind: str, out: str, ready: Any, halt: Any
) -> None:
    """A recorder process: reads ``topics`` from their ends on and writes, for each record,
    when it was seen (``time.monotonic()``, one clock for every process of the machine) to the
    JSON file ``out`` once ``halt`` is set. ``kind``: ``results`` keeps the bench's accepted
    commands (command id -> when, stream, version); ``events`` keeps every event
    (stream:version -> when, topic, partition, offset)."""
    import json

    admin = TopicAdmin(kafka)
    probe = probe_consumer(kafka)
    parts = [(t, p) for t in topics for p in range(admin.partition_count(t) or 0)]
    marks = true_watermarks(probe, parts, fresh=lambda: probe_consumer(kafka))
    probe.close()
    # The product's own tail reader (the command processor's): on Tansu a short fetch wait
    # stops listing a partition of many small batches before its end (connectors.kafka.following).
    consumer = Follower(kafka, {"group.id": "bench-tail", "enable.auto.commit": False}, 10)
    consumer.assign([TopicPartition(t, p, marks[(t, p)][1]) for t, p in parts])
    seen: dict[str, list[Any]] = {}
    ready.set()
    while not halt.is_set():
        for message in consumer.consume(500, timeout=0.05):
            now = time.monotonic()
            if message.error() is not None:
                continue
            if kind == "results":
                value = message.value()
                if value is None:
                    continue
                result = result_from_json(json.loads(value))
                if isinstance(result, Accepted) and result.command_id.startswith("bench-"):
                    seen[result.command_id] = [now, result.stream_id, result.version]
            else:
                headers = dict(message.headers() or [])
                version = int(headers.get("version", b"0"))
                key = f"{(message.key() or b'').decode()}:{version}"
                seen.setdefault(key, [now, message.topic(), message.partition(), message.offset()])
    consumer.close()
    Path(out).write_text(json.dumps(seen))


PROBE_TOPIC = "bench-latency-probe"
IDLE_S = 15.0  # the parts' CPU while no command is sent: measured this long before sending


def probe_broker(
    kafka: KafkaConfig, count: int, rate: float, senders: int, out: str, ready: Any, halt: Any
) -> None:
    """The baseline, in a process of its own: ``count`` records produced to the probe topic at
    ``rate``, each flushed, by ``senders`` threads with a producer each, as the bench sends
    commands; writes when each was sent. The events recorder tails the probe topic: produce ->
    seen is the broker's own latency on this machine, under the same load, with nothing of
    Tributary in the path."""
    import json

    sent: dict[str, float] = {}

    def sender() -> Callable[[int], None]:
        producer = idempotent_producer(kafka)

        def send(i: int) -> None:
            key = f"probe-{i}"
            sent[f"{key}:0"] = time.monotonic()
            producer.produce(
                PROBE_TOPIC, key=key.encode(), value=b"x" * 200, headers={"version": b"0"}
            )
            producer.flush(30)

        return send

    ready.set()
    paced([f"probe-{i}" for i in range(count)], rate, senders, sender, halt)
    Path(out).write_text(json.dumps(sent))


def record_progress(out: str, ready: Any, halt: Any) -> None:
    """A recorder process: polls each social view's committed offsets every 20 ms (views built
    from the settings in the environment, as `tributary run views` builds them) and writes to
    ``out`` each view's history of (when, offsets), one entry per change."""
    import json

    views = [
        v
        for v in configured_views(views_config(load_settings())).values()
        if not v.name.startswith("mirror.")
    ]
    generations = {v.name: v.store.live_generation() for v in views}
    history: dict[str, list[Any]] = {v.name: [] for v in views}
    last: dict[str, Any] = {}
    ready.set()
    while not halt.is_set():
        for view in views:
            try:
                offsets = view.store.committed(generations[view.name]).offsets
            except Exception:
                continue
            now = time.monotonic()
            if offsets != last.get(view.name):
                last[view.name] = offsets
                history[view.name].append([now, offsets])
        time.sleep(0.02)
    Path(out).write_text(json.dumps(history))


def visible(history: list[Any], topic: str, partition: int, offset: int) -> float | None:
    """When a view's store first committed past ``offset`` of ``topic[partition]``."""
    for when, offsets in history:
        if offsets.get(topic, {}).get(str(partition), -1) > offset:
            return float(when)
    return None


def view_phases(settings: Settings) -> dict[str, dict[str, float]]:
    """Per view, the mean seconds of each phase of its triggers (Spark's split) and of its
    batches' fold and write, from the views process's metrics; {} when they cannot be read."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    url = f"http://127.0.0.1:{settings.views_metrics_port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return {}
    sums: dict[tuple[str, str], float] = {}
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        label = {
            "tributary_view_trigger_phase_seconds": "phase",
            "tributary_view_batch_duration_seconds": "stage",
        }.get(family.name)
        if label is None:
            continue
        for sample in family.samples:
            key = (sample.labels["view"], sample.labels[label])
            if sample.name.endswith("_sum"):
                sums[key] = sample.value
            elif sample.name.endswith("_count"):
                counts[key] = sample.value
    means: dict[str, dict[str, float]] = {}
    for (view, phase), count in counts.items():
        if count:
            means.setdefault(view, {})[phase] = sums.get((view, phase), 0.0) / count
            if phase == "triggerExecution":
                means[view]["n"] = count
    return means


class Recorders:
    """The recorder processes (spawned: no client is shared with this process). The sender
    stays alone in this process, so neither its pacing nor the recorders' clocks wait on the
    others for the interpreter lock."""

    def __init__(
        self,
        kafka: KafkaConfig,
        topics: CommandTopics,
        event_topics: list[str],
        probes: int,
        rate: float,
        senders: int,
    ) -> None:
        self.context = multiprocessing.get_context("spawn")
        self.folder = Path(tempfile.mkdtemp(prefix="bench-latency-"))
        self.halt = self.context.Event()
        self.processes: list[Any] = []
        readies = []
        for name, target, args in (
            ("results", record_tail, (kafka, [topics.results], "results")),
            ("events", record_tail, (kafka, [*event_topics, PROBE_TOPIC], "events")),
            ("progress", record_progress, ()),
        ):
            ready = self.context.Event()
            readies.append(ready)
            process = self.context.Process(
                target=target, args=(*args, str(self.folder / f"{name}.json"), ready, self.halt)
            )
            process.start()
            self.processes.append(process)
        for ready in readies:
            if not ready.wait(120):
                self.stop()
                raise RuntimeError("a recorder process did not start in 120 s")
        self.kafka, self.probes, self.rate, self.senders = kafka, probes, rate, senders

    def start_probe(self) -> None:
        """Start the baseline producer (with the first command)."""
        ready = self.context.Event()
        process = self.context.Process(
            target=probe_broker,
            args=(
                self.kafka,
                self.probes,
                self.rate,
                self.senders,
                str(self.folder / "probe.json"),
                ready,
                self.halt,
            ),
        )
        process.start()
        self.processes.insert(0, process)
        ready.wait(60)

    def stop(self) -> dict[str, Any]:
        """Stop the recorders; what each one saw, by name."""
        import json

        self.halt.set()
        for process in self.processes:
            process.join(60)
            if process.is_alive():
                process.kill()
        seen = {}
        for name in ("results", "events", "progress", "probe"):
            path = self.folder / f"{name}.json"
            seen[name] = json.loads(path.read_text()) if path.exists() else {}
        shutil.rmtree(self.folder, ignore_errors=True)
        return seen


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
    parser.add_argument(
        "--senders", type=int, default=16, help="sending threads (each send is flushed)"
    )
    parser.add_argument(
        "--broker-storage",
        choices=("s3", "memory"),
        default="s3",
        help="the local broker's log: s3 (as `tributary up`) or memory (no object store)",
    )
    args = parser.parse_args()

    settings = isolated_settings(
        "tributary-latency-",
        views="examples.social.views:social_views",
        view_trigger_interval_s=args.trigger,
        broker_storage=args.broker_storage,
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


def workload(rng: random.Random, count: int) -> list[tuple[str, dict[str, Any], str]]:
    """The commands to send, in order: (type, data, key). Posts, edits of them, follows and
    unfollows; a command's key is its stream (a post, a follower), so the commands of one key
    are sent one after another by one sender and reach the processor in order."""
    posts: list[int] = []
    follows: set[tuple[int, int]] = set()
    out: list[tuple[str, dict[str, Any], str]] = []
    for i in range(count):
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
        out.append((kind, data, key))
    return out


def paced(
    keys: list[str],
    rate: float,
    senders: int,
    sender: Callable[[], Callable[[int], None]],
    halt: Any = None,
) -> float:
    """Sends item ``i`` (``sender()``'s function, one per sending thread) at ``i / rate``
    seconds after the start, or as soon after as its thread is free: ``senders`` threads, so
    that a flushed send's round trip does not cap the rate. The items of one key go to one
    thread, in order. Returns the seconds it took; raises the first send's error."""
    lanes: list[list[int]] = [[] for _ in range(senders)]
    for i, key in enumerate(keys):
        lanes[zlib.crc32(key.encode()) % senders].append(i)
    errors: list[BaseException] = []
    started = time.monotonic()

    def lane(items: list[int]) -> None:
        try:
            send = sender()
            for i in items:
                if errors or (halt is not None and halt.is_set()):
                    return
                wait = started + i / rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                send(i)
        except BaseException as exc:  # raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=lane, args=(items,)) for items in lanes if items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return time.monotonic() - started


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
    TopicAdmin(kafka).ensure(TopicSpec(PROBE_TOPIC, partitions=1))
    recorders = Recorders(kafka, topics, event_topics, args.commands, args.rate, args.senders)
    commands = workload(rng, args.commands)
    # before the probe and the first command: the parts running, nothing sent
    idle_before, idle_began = cpu.snapshot(), time.monotonic()
    time.sleep(IDLE_S)
    idle_used = cpu.used_between(idle_before, cpu.snapshot())
    idle_s = time.monotonic() - idle_began
    recorders.start_probe()

    def sender() -> Callable[[int], None]:
        own = CommandClient(kafka, topics)  # a client per sender: a flush waits for its own

        def send(i: int) -> None:
            kind, data, key = commands[i]
            command_id = f"bench-{i}"
            sent[command_id] = time.monotonic()
            own.send(kind, data, command_id, key)

        return send

    cpu_before = cpu.snapshot()
    elapsed = paced([key for _, _, key in commands], args.rate, args.senders, sender)
    cpu_used = cpu.used_between(cpu_before, cpu.snapshot())
    print(
        f"sent in {elapsed:.1f}s ({args.commands / elapsed:.1f} commands/s by"
        f" {args.senders} senders); waiting for the views to catch up"
    )
    time.sleep(15)
    phases = view_phases(settings)
    seen = recorders.stop()
    results, events, progress = seen["results"], seen["events"], seen["progress"]

    stages: dict[str, list[float]] = {"broker": [], "result": [], "kafka": []}
    for key, at in seen["probe"].items():
        if key in events:
            stages["broker"].append(events[key][0] - at)
    for view in social:
        stages[view.name] = []
    missing = 0
    for command_id, (result_at, stream_id, version) in results.items():
        if command_id not in sent:
            continue
        began = sent[command_id]
        stages["result"].append(result_at - began)
        found = events.get(f"{stream_id}:{version}")
        if found is None:
            missing += 1
            continue
        when, topic, partition, offset = found
        stages["kafka"].append(when - began)
        for view in social:
            if topic not in view.topics:
                continue
            at = visible(progress.get(view.name, []), topic, partition, offset)
            if at is None:
                missing += 1
                continue
            stages[view.name].append(at - began)
    print(f"\n{len(results)} accepted of {len(sent)} sent; {missing} measurements missing")
    if missing:
        for name in ("cdc", "views"):
            log = settings.home / "logs" / f"run-{name}.log"
            if log.exists():
                print(f"--- {log.name} (end)\n" + log.read_text(errors="replace")[-1500:])
    print(
        f"{'stage':<12}{'n':>6}{'p50 s':>9}{'p95 s':>9}{'p99 s':>9}{'max s':>9}{'p50/broker':>12}"
    )
    base = statistics.median(stages["broker"]) if stages["broker"] else None
    for stage, values in stages.items():
        if not values:
            continue
        p50 = statistics.median(values)
        ratio = f"{p50 / base:>11.1f}x" if base else f"{'-':>12}"
        print(
            f"{stage:<12}{len(values):>6}{p50:>9.3f}{percentile(values, 0.95):>9.3f}"
            f"{percentile(values, 0.99):>9.3f}{max(values):>9.3f}{ratio}"
        )
    print(
        "aim per view (issue 20): p50 < 0.5 s, p99 < 1.5 s at 100 commands/s"
        f" (this run: {args.rate:g}/s asked, trigger interval {args.trigger:.2f} s, broker on"
        f" {args.broker_storage})"
    )
    if phases:
        names = ["latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets"]
        names += ["triggerExecution", "fold", "write"]
        print("\nwhere a view's trigger goes (mean s, from the views process's metrics):")
        print(f"{'view':<22}{'n':>5}" + "".join(f"{n[:13]:>14}" for n in names))
        for view, means in sorted(phases.items()):
            count = int(means.pop("n", 0))
            cells = "".join(f"{means.get(n, float('nan')):>14.3f}" for n in names)
            print(f"{view:<22}{count:>5}{cells}")
    print("\nbefore the first command, the parts running and idle:")
    print("\n".join(cpu.report(idle_used, idle_s)))
    print("\nwhile the commands were sent:")
    print("\n".join(cpu.report(cpu_used, elapsed)))


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
