"""The analytics jobs on a real broker, real Spark and real PostgreSQL, fed a generated workload
with known event times, shuffled arrival, device clocks off by minutes and stragglers; every
window, session, join result and alert compared with a reference computed independently from
the generated events (with the lateness rule applied).

Determinism: each job runs live in many small micro-batches, then is replayed from offset zero
in one large batch (a new generation, swapped in): both hold exactly the same results.

Crash safety: two of the jobs first run in a Spark driver of their own, killed -9 inside their
stores' commit of batch 1; the live run is their restart, and counts nothing twice.

Forgetting (issue 23): after the live run the busiest user is forgotten; the one micro-batch of
each job that carries the ``SubjectForgotten`` removes every output entry naming the user (in
PostgreSQL and on the ``analytics.*`` topics) and keeps every other one. The replay from offset
zero then runs with the forget in its one batch, is compared with the live generation before
the swap, and holds nothing of the user either; `verify` is clean, and names a row that names
the user again behind a job's back.

A lost checkpoint: the sessions job's Spark state deleted, the runner rebuilds it from offset
zero (never resumes with empty state).
"""

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from psycopg import sql

from connectors.stores.postgres import PostgresStore
from examples.social.analytics import AnalyticsConfig, alerts, corrected, ctr, likes, sessions
from examples.social.analytics.stateful import FORGOTTEN
from examples.social.analytics.windows import HLL_RSD
from infra.view_queries import cli_arguments, declared_queries
from projections.time import iso_ms
from projections.view import View
from spark_streaming.replay import SwapRefusedError
from spark_streaming.runner import ViewRunner
from spark_streaming.session import jvm_temp_folder
from spark_streaming.view_job import checkpoint_dir
from tests.integration.analytics import reference
from tests.integration.analytics.feed import T0, AnalyticsFeed, Workload, make_workload
from tests.integration.analytics.lab import (
    applied_counts,
    committed_records,
    held,
    kafka_held,
    lab_config,
    ms,
    replay_jobs,
    run_jobs,
    session_rows,
    views_by_job,
)
from tests.integration.conftest import Endpoints
from views.catalog import JobOptions

LIVE_BATCH = 90  # maxOffsetsPerTrigger of the live runs: many small micro-batches
REPLAY_BATCH = 1_000_000  # a replay reads everything in one micro-batch


@dataclass
class Lab:
    config: AnalyticsConfig
    views: dict[str, View]
    work: Workload
    checkpoints: Path
    forgotten: int | None = None  # the user forgotten, once forgotten

    def options(self, batch: int) -> JobOptions:
        return JobOptions(checkpoint_root=self.checkpoints, max_offsets_per_trigger=batch)


@pytest.fixture
def lab(stack: Endpoints, unique: str, tmp_path: Path) -> Iterator[Lab]:
    config = lab_config(stack.kafka, stack.postgres_dsn, unique, stack.settings.registry_url)
    work = make_workload(config.lateness)
    AnalyticsFeed(config).write(work)
    yield Lab(config, views_by_job(config), work, tmp_path / "checkpoints")
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {config.schema} CASCADE")


# -- what the stores hold, in the reference's shape ---------------------------------------


def late_keys(view: View) -> set[str]:
    return set(held(view)["late"])


def window_counts(view: View, collection: str) -> dict[tuple[int, str], tuple[int, int]]:
    return {
        (ms(f["window_start"]), f["tag"]): (f["posts"], f["late_posts"])
        for f in held(view)[collection].values()
    }


def assert_matches_reference(lab: Lab) -> None:
    work, v = lab.work, lab.views
    beyond_activity = reference.activity_beyond(work)
    beyond_posts = reference.posts_beyond(work)
    assert beyond_activity and beyond_posts  # the workload has stragglers beyond the allowance

    # 1. Device clocks: the corrected time is the true time; raw times are kept.
    events = {f["event_id"]: f for f in held(v["activity"])["events"].values()}
    assert len(events) == len(work.activity)
    for e in work.activity:
        got = events[e.event_id]
        assert got["corrected_time"] == e.true_time
        assert (got["event_time"], got["sent_time"], got["received_time"]) == (
            e.event_time,
            e.sent_time,
            e.received_time,
        )
        assert got["clock_offset_ms"] == e.received_time - e.sent_time
        assert got["beyond_lateness"] == (f"{e.type}:{e.event_id}" in beyond_activity)
    assert late_keys(v["activity"]) == beyond_activity

    # 2. Windows by event time, late posts counted out; late-within ones counted in.
    assert window_counts(v["hashtags"], "minutes") == reference.windows(work, reference.MINUTE)
    assert window_counts(v["trending"], "windows") == reference.windows(work, 5 * reference.MINUTE)
    for job in ("hashtags", "trending"):
        assert late_keys(v[job]) == beyond_posts
    assert session_rows(v["sessions"]) == reference.sessions(work)
    assert late_keys(v["sessions"]) == beyond_activity

    # 3. Searches joined with clicks within the hour.
    expected = reference.ctr(work)
    ctr = held(v["ctr"])
    assert {f["click_id"]: f["delay_ms"] for f in ctr["clicks"].values()} == expected.clicks
    assert {k: f["status"] for k, f in ctr["searches"].items()} == expected.status
    assert {"open", "clicked", "no_click"} <= set(expected.status.values())
    queries = {
        f["query"]: {n: f[n] for n in ("searches", "clicked", "no_click", "open")}
        for f in ctr["queries"].values()
    }
    assert queries == expected.queries
    for f in ctr["queries"].values():
        assert f["ctr"] == pytest.approx(f["clicked"] / f["searches"])
    assert late_keys(v["ctr"]) == beyond_activity

    # 4. Likes with both profiles as of the like (renames afterwards do not rewrite them).
    likes = {
        f["like_id"]: (f["liker_handle"], f["liker_name"], f["author_handle"], f["author_name"])
        for f in held(v["likes"])["likes"].values()
    }
    assert likes == reference.likes(work)
    assert any("-r" in handle for row in likes.values() for handle in row[::2])

    # 5. Patterns.
    alerts = {
        f["alert_id"]: {"kind": f["kind"], "user_id": f["user_id"], "posts": f["posts"]}
        for f in held(v["alerts"])["alerts"].values()
    }
    assert alerts == reference.alerts(work)
    assert {a["kind"] for a in alerts.values()} == {"burst", "churn"}
    assert late_keys(v["alerts"]) == beyond_posts

    # 6. Approximations within their stated bounds.
    hours = {
        (f["metric"], f["subject"], ms(f["window_start"])): f
        for f in held(v["approx"])["hourly"].values()
    }
    truth = reference.hourly(work)
    assert set(hours) == set(truth)
    for key, want in truth.items():
        got = hours[key]
        assert got["events"] == want["events"]
        assert abs(got["distinct_users"] - want["users"]) <= max(1, 3 * HLL_RSD * want["users"])
        delays = want["delays"]
        if delays:
            for name, p in (("p50_ms", 0.5), ("p99_ms", 0.99)):
                assert got[name] == delays[max(0, math.ceil(p * len(delays)) - 1)]
    assert late_keys(v["approx"]) == beyond_posts | {
        k for k in beyond_activity if k.startswith("click:")
    }

    # Late-beyond records are counted exactly, per job, as the jobs' metric.
    for view in v.values():
        assert view.metrics is not None
        assert view.metrics() == {"late_events": len(late_keys(view))}


def ask(lab: Lab, name: str, *words: str) -> Any:
    """A query as ``tributary query NAME WORDS...`` (and the HTTP route) runs it."""
    entry = declared_queries(lab.views.values())[name]
    return entry.query.run(**cli_arguments(entry, list(words)))


def assert_queries_answer_the_reference(lab: Lab) -> None:
    work = lab.work
    for size, window in ((reference.MINUTE, "1m"), (5 * reference.MINUTE, "5m")):
        counts = reference.windows(work, size)
        busiest = max(counts, key=lambda key: (counts[key][0], key))[0]
        at = iso_ms(busiest + size - 30_000)  # a time in the window's last minute
        got = ask(lab, "trending", "--window", window, "--at", at, "--limit", "100")
        want = sorted(
            ((tag, posts) for (start, tag), (posts, _) in counts.items() if start == busiest),
            key=lambda row: (-row[1], row[0]),
        )
        assert ms(got["window_start"]) == busiest
        assert [(r["tag"], r["posts"]) for r in got["hashtags"]] == want

    sessions = reference.sessions(work)
    user = max({u for u, _ in sessions}, key=lambda u: (sum(k[0] == u for k in sessions), u))
    got = ask(lab, "sessions", str(user), "--limit", "1000")
    assert {
        (ms(r["session_start"]), ms(r["session_end"]), r["events"], r["searches"], r["clicks"])
        for r in got
    } == {(start, *rest) for (u, start), rest in sessions.items() if u == user}

    for query, want in reference.ctr(work).queries.items():
        got = ask(lab, "ctr", query)  # the query text as a bare word fills --query
        assert {n: got[n] for n in want} == want, query

    got = ask(lab, "alerts", "--limit", "1000")
    assert {a["alert_id"] for a in got} == set(reference.alerts(work))


ROOT = Path(__file__).resolve().parents[3]


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver with its JVM and Python workers (its own process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def crash_inside_batch_1(
    lab: Lab, stack: Endpoints, unique: str, tmp_path: Path, jobs: tuple[str, ...]
) -> None:
    """Run ``jobs`` in a Spark driver of their own until each is inside its stores' commit of
    batch 1 (data written, not committed), then kill -9 the driver there."""
    markers = tmp_path / "paused"
    markers.mkdir()
    cfg = {
        "bootstrap_servers": stack.bootstrap_servers,
        "kafka_extra": stack.kafka.extra,  # a brought Kafka's security
        "dsn": stack.postgres_dsn,
        "unique": unique,
        "registry_url": stack.settings.registry_url,
        "checkpoint_root": str(lab.checkpoints),
        "jobs": list(jobs),
        "pause_batch": 1,
        "marker_dir": str(markers),
        "local_dir": str(tmp_path / "spark-driver"),
        "max_offsets_per_trigger": LIVE_BATCH,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.analytics.driver", json.dumps(cfg)],
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 240
        while {p.name for p in markers.iterdir()} != set(jobs):
            assert proc.poll() is None, f"driver exited with {proc.returncode}"
            assert time.monotonic() < deadline, "the driver never reached the crash point"
            time.sleep(0.2)
    finally:
        kill_group(proc)  # kill -9 with batch 1 of each job inside a store's commit
    # The killed JVM left RocksDB's library (15 MB, unpacked at each start) in the temporary
    # folder the driver gave it under its scratch space, not in /tmp; the next driver there
    # removes that folder.
    scratch = Path(cfg["local_dir"])
    assert [p.parent.name for p in scratch.glob("jvm-tmp-*/librocksdbjni*.so")] == [
        f"jvm-tmp-{proc.pid}"
    ]
    jvm_temp_folder(scratch)
    assert not (scratch / f"jvm-tmp-{proc.pid}").exists()
    views = [lab.views[j] for j in jobs]
    assert all(v.store.committed(v.store.live_generation()).batch_id == 0 for v in views)


#: Jobs that start in a driver killed -9 inside their stores' commit of batch 1; the live run
#: is their restart. A window (corrections of published windows) and the pattern detector
#: (timers, retractions, and a Kafka store whose readers must see each alert once).
CRASHED = ("hashtags", "alerts")


@pytest.mark.timeout(600)
def test_jobs_equal_the_reference_live_and_replayed_in_one_batch(
    spark: Any, lab: Lab, stack: Endpoints, unique: str, tmp_path: Path
) -> None:
    crash_inside_batch_1(lab, stack, unique, tmp_path, CRASHED)
    crashed = {lab.views[job].name for job in CRASHED}
    views = list(lab.views.values())
    # The approximations read every topic (about 500 records, twice what each other job
    # reads): twice the batch keeps them at three micro-batches like the others. With six they
    # finished last, and the live run took 71 s alone; with three, 54 s.
    wider = {lab.views["approx"].name: lab.options(2 * LIVE_BATCH)}
    runs = run_jobs(spark, views, lab.config.kafka, lab.options(LIVE_BATCH), wider)
    for name, run in runs.items():
        before = 1 if name in crashed else 0  # batch 0, committed before the kill
        assert before + len(run.reports) >= 3, name  # many small micro-batches
        assert run.dropped_by_watermark == 0, name  # Spark dropped nothing silently
    assert_matches_reference(lab)
    assert_queries_answer_the_reference(lab)

    # Late posts within the allowance updated windows already published: the same key was
    # written again with a newer value (a correction), and downstream got it too.
    corrected = [
        key
        for key, count in applied_counts(lab.views["hashtags"], "minutes").items()
        if count > 1 and held(lab.views["hashtags"])["minutes"][key]["late_posts"] > 0
    ]
    assert corrected
    # Downstream teams read the same results from the analytics topics.
    for job, collection in (("hashtags", "minutes"), ("trending", "windows")):
        downstream = {
            (ms(f["window_start"]), f["tag"]): (f["posts"], f["late_posts"])
            for f in kafka_held(lab.views[job])[collection].values()
        }
        assert downstream == window_counts(lab.views[job], collection)
    assert {f["alert_id"] for f in kafka_held(lab.views["alerts"])["alerts"].values()} == set(
        reference.alerts(lab.work)
    )

    # The restart after the kill -9 counted nothing twice: downstream saw every alert once
    # (no committed record repeats an earlier one), and each churn alert was applied once.
    records = committed_records(lab.views["alerts"], "alerts")
    assert len(records) == len(set(records))
    published = {json.loads(value)["alert_id"] for _, value in records if value is not None}
    assert set(reference.alerts(lab.work)) <= published
    alerts = held(lab.views["alerts"])["alerts"]
    churn = [key for key, f in alerts.items() if f["kind"] == "churn"]
    assert churn and all(applied_counts(lab.views["alerts"], "alerts")[k] == 1 for k in churn)

    forget_the_busiest_user(spark, lab)

    # A replay from offset zero in one batch (the forget with it) holds what the live runs
    # hold: the reference, without the forgotten user. It is compared before the swap.
    live = {name: held(view) for name, view in lab.views.items()}
    try:
        results = replay_jobs(spark, views, lab.config.kafka, lab.options(REPLAY_BATCH))
    except SwapRefusedError as exc:  # name what differs
        raise AssertionError(
            [
                (c.kind, d.collection, d.key, d.live, d.shadow)
                for c in exc.result.comparisons
                for d in c.differences
            ]
        ) from exc
    assert {r.batches for r in results.values()} == {1}
    assert all(r.compared and r.identical for r in results.values()), results
    assert {name: held(view) for name, view in lab.views.items()} == live
    assert_a_lost_checkpoint_is_rebuilt_from_offset_zero(spark, lab)
    assert_verify_names_a_row_written_behind_the_jobs_back(lab)


# -- forgetting (issue 23) -------------------------------------------------------------------

#: The jobs whose outputs name users, and the fields that do (collection -> fields).
HOLDERS: dict[str, Mapping[str, Sequence[str]]] = {
    "activity": corrected.HOLDERS,
    "sessions": sessions.HOLDERS,
    "ctr": ctr.HOLDERS,
    "alerts": alerts.HOLDERS,
    "likes": likes.HOLDERS,
}


def naming(entries: dict[str, dict[str, Any]], fields: Sequence[str], user: int) -> set[str]:
    """The keys of the entries that name ``user`` in one of ``fields``."""
    return {key for key, f in entries.items() if user in {f.get(name) for name in fields}}


def forget_the_busiest_user(spark: Any, lab: Lab) -> None:
    """The jobs whose outputs name users read the ``SubjectForgotten`` of the busiest user from
    ``events.subject``: the one micro-batch that carries it deletes every output entry naming
    the user (as user, follower or followee; in PostgreSQL and on the ``analytics.*`` topics
    downstream teams read) and leaves every other entry as it was; `verify` is clean."""
    jobs = {name: lab.views[name] for name in HOLDERS}
    before = {name: held(view) for name, view in jobs.items()}
    downstream_before = {name: kafka_held(view) for name, view in jobs.items()}

    def named(user: int) -> dict[str, int]:
        return {
            f"{name}.{collection}": len(naming(before[name][collection], fields, user))
            for name, holders in HOLDERS.items()
            for collection, fields in holders.items()
        }

    users = {f.get("user_id") for f in before["sessions"]["sessions"].values()}
    user = max(sorted(u for u in users if u is not None), key=lambda u: sum(named(u).values()))
    assert all(named(user).values()), named(user)  # every output names the user before
    assert all(view.verify() == [] for view in jobs.values())  # nobody forgotten yet
    # Spark's state holds the user too: open searches in ctr's partitions, halves of likes in
    # the likes join's buckets (read with Spark's state data source)
    assert all(state_naming(spark, lab, user).values()), state_naming(spark, lab, user)

    AnalyticsFeed(lab.config).write_forgotten(user, T0 + 3 * 3_600_000)
    # Only these jobs read the subjects topic; the others have nothing new to read (the replay
    # below, from offset zero with the forget in it, still equals their live generation).
    runs = run_jobs(spark, list(jobs.values()), lab.config.kafka, lab.options(LIVE_BATCH))
    for name, view in jobs.items():
        carrying = [r for r in runs[view.name].reports if r.records]
        assert len(carrying) == 1, (name, carrying)  # the forget came in one micro-batch
        expected = {
            collection: (
                {k: f for k, f in entries.items() if k not in naming(entries, fields, user)}
                if (fields := HOLDERS[name].get(collection)) is not None
                else entries
            )
            for collection, entries in before[name].items()
        }
        expected[FORGOTTEN] = {str(user): {"subject_type": "user", "user_id": user}}
        assert held(view) == expected, name  # the user's entries gone, every other one kept
        downstream = kafka_held(view)
        for collection, fields in HOLDERS[name].items():
            was = downstream_before[name][collection]
            assert naming(was, fields, user), (name, collection)  # downstream had the user
            gone = {k: f for k, f in was.items() if k not in naming(was, fields, user)}
            assert downstream[collection] == gone, (name, collection)
        assert view.verify() == [], name
    # every partition's and every bucket's state is purged in that batch too
    assert state_naming(spark, lab, user) == {"ctr": 0, "likes": 0}
    lab.forgotten = user


def state_naming(spark: Any, lab: Lab, user: int) -> dict[str, int]:
    """How many of the stateful operators' entries name ``user``: the searches in ``ctr``'s
    per-partition state (hidden ones keep no user id), the halves of likes in ``likes``' join
    buckets (as liker or author). Spark numbers a query's stateful operators from its sink: the
    second of each job's two processors is operator 0."""

    def values(job: str, operator: int, variable: str) -> list[Any]:
        view = lab.views[job]
        checkpoint = checkpoint_dir(lab.checkpoints, view.name, view.store.live_generation())
        frame = (
            spark.read.format("statestore")
            .option("path", str(checkpoint))
            .option("operatorId", operator)
            .option("stateVarName", variable)
            .load()
        )
        return [row["value"] for row in frame.collect()]

    searches = [
        ctr._frame_of(value["searches"], ctr.SEARCH_COLUMNS) for value in values("ctr", 1, "ctr")
    ]
    halves = [
        json.loads(fields)
        for value in values("likes", 0, "halves")
        for fields in pa.ipc.open_stream(value["halves"]).read_all().column("fields").to_pylist()
    ]
    return {
        "ctr": sum(int((frame["user_id"] == user).sum()) for frame in searches),
        "likes": sum(user in (half["liker_id"], half["author_id"]) for half in halves),
    }


def assert_verify_names_a_row_written_behind_the_jobs_back(lab: Lab) -> None:
    """`verify` names an entry that names the forgotten user again (written behind the job)."""
    assert lab.forgotten is not None
    store = lab.views["sessions"].store
    assert isinstance(store, PostgresStore)
    table = sql.Identifier(lab.config.schema, store.table("sessions", None))
    with psycopg.connect(lab.config.dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("UPDATE {} SET user_id = %s WHERE ctid = (SELECT ctid FROM {} LIMIT 1)").format(
                table, table
            ),
            (lab.forgotten,),
        )
    found = lab.views["sessions"].verify()
    assert len(found) == 1 and f"forgotten user {lab.forgotten}: sessions" in found[0], found


def assert_a_lost_checkpoint_is_rebuilt_from_offset_zero(spark: Any, lab: Lab) -> None:
    """The sessions job's checkpoint (its Spark state) is deleted: the runner rebuilds the job
    from offset zero into a new generation, never resumes with empty state."""
    view = lab.views["sessions"]
    want = session_rows(view)
    before = view.store.live_generation()
    shutil.rmtree(lab.checkpoints / view.name / before)  # the state is gone
    lines: list[str] = []
    stop = threading.Event()
    runner = ViewRunner(
        spark,
        [view],
        lab.config.kafka,
        lab.options(LIVE_BATCH),
        log=lines.append,
        replay_options=lab.options(REPLAY_BATCH),
    )
    thread = threading.Thread(target=runner.run, args=(stop,))
    thread.start()
    try:
        deadline = time.monotonic() + 240
        while not any("running generation" in line for line in lines):
            assert time.monotonic() < deadline, lines
            assert thread.is_alive(), lines
            time.sleep(0.5)
    finally:
        stop.set()
        thread.join(120)
    assert any("must be rebuilt from offset zero" in line for line in lines), lines
    assert view.store.live_generation() != before
    assert session_rows(view) == want
