"""Benchmark: the stream analytics jobs on the activity stream (not a test).

    .venv/bin/python bench/analytics.py [--events 1000000] [--jobs corrected,sessions,ctr]
        [--batch 200000] [--partitions 2] [--rate 200] [--live-seconds 30]

Starts its own local stack (PostgreSQL, SeaweedFS + Tansu, Redis) on free ports, writes about N
generated activity events (``generate(ActivityPlan(...))``: sessions over a day, skewed device
clocks, late events and stragglers beyond the allowed lateness) to an activity topic with
``ActivityProducer`` (in a child process, so the generator's memory does not count as the
driver's), then measures in the same run:

  plain     a plain confluent-kafka read of the whole topic (assigned partitions): the baseline
  source    the Kafka source alone (Spark's, or the project's without spark-sql-kafka), into
            Spark's noop sink (trigger availableNow)
  corrected the stateless job (device clocks corrected; one row per event): the reference
  sessions  session windows (``transformWithState``, 30-minute gap)
  ctr       searches joined with their clicks within an hour (stream-stream join)

Each job runs as it does in production (``ViewJob``: its PostgreSQL store and its Kafka output
topic, RocksDB state) over the whole topic from offset zero, trigger availableNow,
``--batch`` offsets per micro-batch. Printed per job: events/s and the ratio to the plain read;
the state at the end and its peak (Spark's ``numRowsTotal`` and ``memoryUsedBytes`` summed over
the state operators, RocksDB's SST files) and the checkpoint folder on disk; peak resident
memory (sampled every 0.25 s) of the driver's Python process and of the JVM (VmRSS, RocksDB's
off-heap memory included), and of the JVM's child processes (the Python workers: their PSS,
summed, as forked workers share pages).

Then, for ``sessions`` and ``ctr`` (``--live-jobs``), end-to-end latency: the job runs live on
a topic of its own (trigger interval and batch cap as in the settings) while events are sent
at ``--rate`` events/s for ``--live-seconds`` (``received_time`` stamped as each is sent);
each event's latency runs from its ``received_time`` to the moment the micro-batch holding it
committed to the job's stores (``on_batch``, after the primary store's commit: its window is
then updated for readers). Prints p50 / p95 / p99 / max per event, and per batch for its
oldest event. A live run that fails is reported (with what a plain consumer could read of the
same range), the others still run; the stack and every temporary folder go in any case.
"""

import argparse
import contextlib
import gc
import json
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.spark_reads import PLAIN_CONSUMER, plain_read, source_alone
from bench.stopping import stop_cleanly_on_sigterm
from connectors.kafka import KafkaConfig, TopicAdmin
from examples.social.activity import (
    HOUR_MS,
    ActivityEvent,
    ActivityPlan,
    ActivityProducer,
    generate,
    live,
    now_ms,
)
from examples.social.analytics import AnalyticsConfig, corrected_view, ctr_view, sessions_view
from infra.stack import LocalStack
from infra.stack.isolated import isolated_settings
from projections.time import Lateness
from projections.view import View
from spark_streaming.session import spark_session
from spark_streaming.stream import has_spark_kafka_connector
from spark_streaming.view_job import BatchReport, ViewJob
from views.catalog import JobOptions

EVENTS_PER_SESSION = 8.75  # generate(): 1-6 searches per session, 0-3 clicks per search
JOBS: dict[str, Callable[[AnalyticsConfig], View]] = {
    "corrected": corrected_view,
    "sessions": sessions_view,
    "ctr": ctr_view,
}
KINDS = {
    "corrected": "stateless",
    "sessions": "session windows",
    "ctr": "stream-stream join",
}
JOB_TIMEOUT_S = 1800.0


# -- memory -------------------------------------------------------------------------------


def rss_kb(pid: int, field_name: str = "VmRSS", source: str = "status") -> int:
    """A process's memory figure (kB) from /proc/<pid>/<source> (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/{source}") as status:
            for line in status:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (from /proc/*/stat)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class MemorySampler:
    """Peak VmRSS of the driver (this process) and the JVM, and peak PSS of the JVM's children
    (the Python workers, summed), sampled every ``interval`` seconds while in use."""

    def __init__(self, jvm_pid: int, interval: float = 0.25) -> None:
        self.jvm_pid = jvm_pid
        self.interval = interval
        self.peaks = {"driver": 0, "jvm": 0, "workers": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        now = {
            "driver": rss_kb(os.getpid()),
            "jvm": rss_kb(self.jvm_pid),
            # Forked workers share pages: their proportional share (PSS), not RSS, is summed.
            "workers": sum(rss_kb(p, "Pss", "smaps_rollup") for p in descendants(self.jvm_pid)),
        }
        for name, kb in now.items():
            self.peaks[name] = max(self.peaks[name], kb)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> "MemorySampler":
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def jvm_pid(spark: Any) -> int:
    return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())


def mb(kb: float) -> str:
    return f"{kb / 1024:,.0f}"


# -- the workload -------------------------------------------------------------------------


def workload_plan(events: int, span_hours: float, allowed_ms: int) -> ActivityPlan:
    """A plan that generates about ``events`` events: sessions over ``span_hours``, about ten
    sessions per user."""
    sessions = max(1, round(events / EVENTS_PER_SESSION))
    return ActivityPlan(
        sessions=sessions,
        users=max(1, sessions // 10),
        span_ms=round(span_hours * HOUR_MS),
        allowed_ms=allowed_ms,
        seed=11,
    )


def _fill_child(
    kafka: KafkaConfig, topic: str, plan: ActivityPlan, partitions: int, out: Any
) -> None:
    started = time.perf_counter()
    events = generate(plan)
    generated = time.perf_counter() - started
    producer = ActivityProducer(kafka, topic, partitions)
    sent = producer.send(events)
    producer.flush(600)
    out.put((sent, generated, time.perf_counter() - started))


def fill(
    kafka: KafkaConfig, topic: str, plan: ActivityPlan, partitions: int
) -> tuple[int, float, float]:
    """Generate and write the workload in a child process (forked before Spark starts):
    events written, seconds generating, seconds in all."""
    context = multiprocessing.get_context("fork")
    out = context.SimpleQueue()
    child = context.Process(target=_fill_child, args=(kafka, topic, plan, partitions, out))
    child.start()
    try:
        child.join(3600)
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    if child.exitcode != 0 or out.empty():
        raise RuntimeError(f"filling {topic} failed (exit code {child.exitcode})")
    sent, generated, total = out.get()
    return int(sent), float(generated), float(total)


# -- baselines ----------------------------------------------------------------------------


def warm_python_workers(spark: Any) -> None:
    """Start the Python workers once (a job's first batch would pay for it otherwise)."""
    spark.range(1000, numPartitions=2).mapInArrow(lambda batches: batches, "id long").count()


# -- one job over the whole topic ---------------------------------------------------------


@dataclass
class JobRun:
    name: str
    seconds: float
    records: int
    batches: int
    busy_s: float  # inside micro-batches (Spark's triggerExecution)
    fold_s: float
    write_s: float
    rows_out: int
    late: int
    state_rows: int
    state_rows_peak: int
    state_bytes: int
    state_bytes_peak: int
    sst_bytes: int
    checkpoint_bytes: int
    memory: dict[str, int] = field(default_factory=dict)


def state_figures(progress: list[Any]) -> tuple[int, int, int, int, int]:
    """State rows (last, peak), state memory (last, peak), RocksDB SST bytes (last), each
    summed over the batch's state operators."""
    rows, used, sst = [], [], []
    for p in progress:
        ops = p.get("stateOperators") or []
        rows.append(sum(int(op.get("numRowsTotal", 0)) for op in ops))
        used.append(sum(int(op.get("memoryUsedBytes", 0)) for op in ops))
        sst.append(
            sum(int((op.get("customMetrics") or {}).get("rocksdbSstFileSize", 0)) for op in ops)
        )
    if not rows:
        return 0, 0, 0, 0, 0
    return rows[-1], max(rows), used[-1], max(used), sst[-1]


def folder_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, name))
    return total


def run_job(
    spark: Any,
    view: View,
    kafka: KafkaConfig,
    options: JobOptions,
    topic: str,
    ends: dict[int, int],
    pid: int,
) -> JobRun:
    """The job from offset zero to the end of the topic (availableNow), timed from the
    ViewJob's creation (its stores' setup included) to the query's end."""
    reports: list[BatchReport] = []
    with MemorySampler(pid) as memory:
        started = time.perf_counter()
        job = ViewJob(spark, view, kafka, options, on_batch=reports.append)
        try:
            query = job.start(available_now=True)
            try:
                if not query.awaitTermination(JOB_TIMEOUT_S):
                    raise TimeoutError(f"{view.name} did not finish in {JOB_TIMEOUT_S:g} s")
            finally:
                if query.isActive:
                    query.stop()
            seconds = time.perf_counter() - started
            if query.exception() is not None:
                raise RuntimeError(f"{view.name}: {query.exception()}")
            progress = list(query.recentProgress)
        finally:
            job.close()
    reached = reports[-1].offsets.get(topic, {}) if reports else {}
    assert all(reached.get(str(p), 0) >= o for p, o in ends.items()), (view.name, reached)
    rows, rows_peak, used, used_peak, sst = state_figures(progress)
    late = int((view.metrics() if view.metrics else {}).get("late_events", 0))
    return JobRun(
        name=view.name,
        seconds=seconds,
        records=sum(r.records for r in reports),
        batches=len(reports),
        busy_s=sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000,
        fold_s=sum(r.fold_s for r in reports),
        write_s=sum(r.write_s for r in reports),
        rows_out=sum(r.folded for r in reports),
        late=late,
        state_rows=rows,
        state_rows_peak=rows_peak,
        state_bytes=used,
        state_bytes_peak=used_peak,
        sst_bytes=sst,
        checkpoint_bytes=folder_bytes(job.checkpoint),
        memory=dict(memory.peaks),
    )


# -- latency of a live job ----------------------------------------------------------------


@dataclass
class Latency:
    name: str
    sent: int
    seconds: float
    batches: int
    per_event: list[int]  # ms
    per_batch: list[int]  # ms, the batch's oldest event
    batch_s: float  # mean seconds in a batch (fold + write)


def live_events(rate: float, seconds: float, allowed_ms: int, start_ms: int) -> list[ActivityEvent]:
    """Generated events received between ``start_ms`` and ``seconds`` later, about ``rate``
    per second (sessions starting within that span; none beyond the allowed lateness)."""
    target = max(1, round(rate * seconds))
    end = start_ms + round(seconds * 1000)

    def within(sessions: int) -> list[ActivityEvent]:
        plan = ActivityPlan(
            sessions=sessions,
            users=max(1, sessions // 2),
            start_ms=start_ms,
            span_ms=round(seconds * 1000),
            beyond=0.0,
            allowed_ms=allowed_ms,
            seed=13,
        )
        return [e for e in generate(plan) if e.received_time < end]

    events = within(target)
    events = within(max(1, round(target * target / max(1, len(events)))))
    return events


def percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return float(ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))])


def read_received(
    kafka: KafkaConfig,
    topic: str,
    start: dict[int, int],
    end: dict[int, int],
    timeout: float = 120.0,
) -> list[tuple[int, int, int]]:
    """(partition, offset, received_time) of every record between two positions."""
    consumer = Consumer(kafka.client_properties(**PLAIN_CONSUMER))
    consumer.assign([TopicPartition(topic, p, start.get(p, 0)) for p in end])
    left = sum(end[p] - start.get(p, 0) for p in end)
    out = []
    deadline = time.monotonic() + timeout
    while left > 0 and time.monotonic() < deadline:
        for message in consumer.consume(min(left, 10_000), timeout=1.0):
            value = message.value()
            if message.error() is None and value is not None:
                received = int(json.loads(value)["received_time"])
                out.append((message.partition() or 0, message.offset() or 0, received))
                left -= 1
    consumer.close()
    return out


class LiveRunFailed(Exception):
    """A live run stopped (the other figures stand)."""


def first_error(exc: BaseException) -> str:
    """The line of a (long, plan-dumping) query error that names the cause."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = [line for line in lines if "Error:" in line and "Traceback" not in line]
    return (named or lines or [type(exc).__name__])[-1][:300]


def measure_latency(
    spark: Any,
    name: str,
    config: AnalyticsConfig,
    kafka: KafkaConfig,
    options: JobOptions,
    partitions: int,
    rate: float,
    seconds: float,
) -> Latency:
    view = JOBS[name](config)
    topic = config.activity_topic
    producer = ActivityProducer(kafka, topic, partitions)
    marks: list[tuple[int, BatchReport]] = []
    job = ViewJob(spark, view, kafka, options, on_batch=lambda r: marks.append((now_ms(), r)))
    query = job.start()
    admin = TopicAdmin(kafka)
    start: dict[int, int] = {}
    try:

        def alive() -> None:
            if query.exception() is not None:
                raise RuntimeError(f"{view.name}: {query.exception()}")
            if not query.isActive:  # a JVM Error (StackOverflowError) leaves no exception
                raise RuntimeError(f"{view.name}: the query stopped (its error is in the log)")

        # Warm up: one event through one batch (query start, workers), not measured.
        producer.search("s-warm-up", 1, "warm up")
        deadline = time.monotonic() + 300
        while not marks:
            alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{view.name}: no batch within 300 s")
            time.sleep(0.05)
        start = admin.end_offsets(topic)
        events = live_events(rate, seconds, config.lateness.allowed_ms, now_ms() + 2_000)
        began = time.perf_counter()
        i = 0
        while i < len(events):
            now = now_ms()
            due = []
            while i < len(events) and events[i].received_time <= now:
                due.append(live(events[i], now))
                i += 1
            if due:
                producer.send(due)
                producer.producer.poll(0)
            else:
                alive()
            time.sleep(0.005)
        producer.flush()
        sent_s = time.perf_counter() - began
        end = admin.end_offsets(topic)
        deadline = time.monotonic() + 300
        while not marks or any(
            marks[-1][1].offsets.get(topic, {}).get(str(p), 0) < o for p, o in end.items()
        ):
            alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{view.name}: the sent events were not committed in 300 s")
            time.sleep(0.05)
    except (RuntimeError, TimeoutError) as exc:
        # Could a plain consumer read what the job could not?
        reached = admin.end_offsets(topic)
        got = read_received(kafka, topic, start, reached, timeout=20)
        expected = sum(o - start.get(p, 0) for p, o in reached.items())
        raise LiveRunFailed(
            f"{first_error(exc)} -- then a plain consumer read {len(got):,} of the"
            f" {expected:,} records sent (end offsets {reached})"
        ) from exc
    finally:
        if query.isActive:
            query.stop()
        job.close()
    records = read_received(kafka, topic, start, end)
    ordered = sorted(marks, key=lambda m: m[1].batch_id)
    per_event: list[int] = []
    oldest: dict[int, int] = {}
    for partition, offset, received in records:
        for at, report in ordered:
            if report.offsets.get(topic, {}).get(str(partition), 0) > offset:
                per_event.append(at - received)
                oldest[report.batch_id] = max(oldest.get(report.batch_id, 0), at - received)
                break
    measured = [r for _, r in ordered if r.batch_id in oldest]
    return Latency(
        name=view.name,
        sent=len(records),
        seconds=sent_s,
        batches=len(measured),
        per_event=per_event,
        per_batch=list(oldest.values()),
        batch_s=sum(r.fold_s + r.write_s for r in measured) / max(1, len(measured)),
    )


# -- the run ------------------------------------------------------------------------------


def analytics_config(kafka: KafkaConfig, dsn: str, lateness: Lateness, tag: str) -> AnalyticsConfig:
    return AnalyticsConfig(
        kafka=kafka,
        dsn=dsn,
        schema="views",
        activity_topic=f"{tag}activity",
        lateness=lateness,
        prefix=tag,
        topic_prefix=f"{tag}analytics.",
    )


def print_throughput(total: int, plain_s: float, source_s: float, runs: list[JobRun]) -> None:
    print(f"\n{'run':<36}{'seconds':>9}{'events/s':>11}{'vs plain':>10}{'in batches/s':>14}")
    print(f"{'plain confluent-kafka read':<36}{plain_s:>9.2f}{total / plain_s:>11,.0f}{1:>9.4f}x")
    print(
        f"{'Spark source -> noop':<36}{source_s:>9.2f}{total / source_s:>11,.0f}"
        f"{plain_s / source_s:>9.4f}x"
    )
    for r in runs:
        label = f"{r.name} ({KINDS[r.name]}, {r.batches} b.)"
        print(
            f"{label:<36}{r.seconds:>9.2f}{total / r.seconds:>11,.0f}{plain_s / r.seconds:>9.4f}x"
            f"{total / max(r.busy_s, 1e-9):>14,.0f}"
        )
    print("\nwhere a job's time goes (s): wall = start (stores, query) + in batches;")
    print("in batches = source + fold on the executors + transfer (fold) + stores (write) + rest")
    print(
        f"{'job':<12}{'wall':>8}{'start':>8}{'batches':>9}{'fold':>8}{'write':>8}"
        f"{'rows out':>11}{'late':>8}"
    )
    for r in runs:
        print(
            f"{r.name:<12}{r.seconds:>8.2f}{r.seconds - r.busy_s:>8.2f}{r.busy_s:>9.2f}"
            f"{r.fold_s:>8.2f}{r.write_s:>8.2f}{r.rows_out:>11,}{r.late:>8,}"
        )


def print_state(runs: list[JobRun]) -> None:
    print(
        "\nstate (Spark's stateOperators summed; last batch / peak) and memory (MB; peak"
        " VmRSS of the driver and the JVM, peak PSS of the Python workers summed)"
    )
    print(
        f"{'job':<12}{'rows':>10}{'rows peak':>11}{'mem MB':>8}{'peak':>7}{'SST MB':>8}"
        f"{'ckpt MB':>9}{'driver':>8}{'JVM':>7}{'workers':>9}"
    )
    for r in runs:
        print(
            f"{r.name:<12}{r.state_rows:>10,}{r.state_rows_peak:>11,}"
            f"{r.state_bytes / 2**20:>8.1f}{r.state_bytes_peak / 2**20:>7.1f}"
            f"{r.sst_bytes / 2**20:>8.1f}{r.checkpoint_bytes / 2**20:>9.1f}"
            f"{mb(r.memory['driver']):>8}{mb(r.memory['jvm']):>7}{mb(r.memory['workers']):>9}"
        )


def print_latency(results: list[Latency], interval: float, cap: int | None) -> None:
    print(
        f"\nend-to-end latency, received_time -> the batch's commit to the stores (ms);"
        f" live, trigger {interval:g} s, maxOffsetsPerTrigger {cap}"
    )
    print(
        f"{'job':<12}{'events':>8}{'ev/s':>7}{'batches':>9}{'s/batch':>9}"
        f"{'p50':>7}{'p95':>7}{'p99':>7}{'max':>7}{'oldest p50':>12}{'oldest p99':>12}"
    )
    for r in results:
        print(
            f"{r.name.removeprefix('live-').split('.')[0]:<12}{r.sent:>8,}"
            f"{r.sent / r.seconds:>7.0f}{r.batches:>9}{r.batch_s:>9.2f}"
            f"{percentile(r.per_event, 0.5):>7.0f}{percentile(r.per_event, 0.95):>7.0f}"
            f"{percentile(r.per_event, 0.99):>7.0f}{max(r.per_event, default=0):>7}"
            f"{percentile(r.per_batch, 0.5):>12.0f}{percentile(r.per_batch, 0.99):>12.0f}"
        )


def print_service_logs(folder: Path, lines: int = 15) -> None:
    """The end of each service's log (on failure: the folder goes with the stack)."""
    for path in sorted(folder.glob("*.log")):
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        print(f"-- {path.name} (last {len(tail)} lines)", *tail, sep="\n", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument(
        "--jobs", default="corrected,sessions,ctr", help="of corrected,sessions,ctr"
    )
    parser.add_argument("--live-jobs", default="sessions,ctr", help="latency runs ('' for none)")
    parser.add_argument("--batch", type=int, default=200_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--partitions", type=int, default=2, help="of the activity topic")
    parser.add_argument("--span-hours", type=float, default=24.0, help="sessions start within")
    parser.add_argument("--rate", type=float, default=200.0, help="events/s of the live runs")
    parser.add_argument("--live-seconds", type=float, default=30.0)
    args = parser.parse_args()
    jobs = [j for j in args.jobs.split(",") if j]
    live_jobs = [j for j in args.live_jobs.split(",") if j]
    unknown = set(jobs + live_jobs) - set(JOBS)
    if unknown:
        parser.error(f"unknown jobs {sorted(unknown)}: choose from {sorted(JOBS)}")

    settings = isolated_settings("tributary-bench-")
    work = Path(tempfile.mkdtemp(prefix="tributary-bench-work-"))
    stack = LocalStack(settings)
    spark = None
    try:
        stack.up()
        kafka = settings.kafka("bench")
        dsn = settings.postgres().dsn
        lateness = Lateness.of_seconds(settings.allowed_lateness_s, settings.lateness_slack_s)
        config = analytics_config(kafka, dsn, lateness, "bench.")
        topic = config.activity_topic
        plan = workload_plan(args.events, args.span_hours, lateness.allowed_ms)
        sent, generate_s, fill_s = fill(kafka, topic, plan, args.partitions)
        ends = TopicAdmin(kafka).end_offsets(topic)
        total = sum(ends.values())
        assert total == sent, (total, sent)
        print(
            f"== {total:,} activity events ({plan.sessions:,} sessions of {plan.users:,} users"
            f" over {args.span_hours:g} h), {args.partitions} partitions; generated in"
            f" {generate_s:.1f}s, written in {fill_s - generate_s:.1f}s"
        )

        spark = spark_session(
            settings.spark_master,
            "tributary-bench-analytics",
            driver_memory=settings.spark_driver_memory,
            local_dir=str(work / "spark"),
        )
        pid = jvm_pid(spark)
        print(
            f"Spark {spark.version} {settings.spark_master}, driver memory"
            f" {settings.spark_driver_memory}, Kafka source:"
            f" {'Spark' if has_spark_kafka_connector(spark) else 'the project'}'s,"
            f" maxOffsetsPerTrigger {args.batch:,}, allowed lateness {lateness.allowed_ms} ms"
            f" + slack {lateness.slack_ms} ms"
        )
        source_alone(spark, kafka, topic, work / "warm", args.batch)  # JVM warm
        warm_python_workers(spark)
        plain_s = plain_read(kafka, topic, ends)
        source_s, _, _ = source_alone(spark, kafka, topic, work / "source", args.batch)
        options = JobOptions(
            checkpoint_root=work / "checkpoints", max_offsets_per_trigger=args.batch
        )
        runs = []
        for name in jobs:
            started = time.perf_counter()
            view = JOBS[name](config)
            run = run_job(spark, view, kafka, options, topic, ends, pid)
            run.name = name
            runs.append(run)
            print(f"   {name}: {time.perf_counter() - started:.1f}s", flush=True)
        plain_s = min(plain_s, plain_read(kafka, topic, ends))
        print_throughput(total, plain_s, source_s, runs)
        print_state(runs)

        latencies = []
        live_options = JobOptions(
            checkpoint_root=work / "live",
            max_offsets_per_trigger=settings.view_max_offsets_per_trigger,
            trigger_interval_s=settings.view_trigger_interval_s,
        )
        failed = []
        for name in live_jobs:
            live_config = analytics_config(kafka, dsn, lateness, f"live-{name}.")
            try:
                latencies.append(
                    measure_latency(
                        spark,
                        name,
                        live_config,
                        kafka,
                        live_options,
                        args.partitions,
                        args.rate,
                        args.live_seconds,
                    )
                )
            except LiveRunFailed as exc:
                failed.append(f"{name}: live run failed: {exc}")
        if latencies or failed:
            print_latency(
                latencies, settings.view_trigger_interval_s, settings.view_max_offsets_per_trigger
            )
        for line in failed:
            print(line)
        print(
            f"\nlifetime peaks: driver (ru_maxrss) "
            f"{mb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)} MB,"
            f" JVM (VmHWM) {mb(rss_kb(pid, 'VmHWM'))} MB"
        )
    except BaseException:
        print_service_logs(settings.home / "logs")
        raise
    finally:
        if spark is not None:
            for query in spark.streams.active:
                query.stop()
            spark.stop()
        gc.collect()  # Kafka clients of the jobs' stores go before the broker does
        stack.down()
        shutil.rmtree(settings.home.parent, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
