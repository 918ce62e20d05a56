"""The ``eventsourcing`` persistence module (``event_store.eventsourcing``) against the library's
own PostgreSQL module, on the same database in the same run.

Run: ``.venv/bin/python bench/append.py --only eventsourcing [--seconds 4] [--rounds 3]
[--reads 200000]`` (``bench/append.py`` without ``--only`` runs it last). Not named
``eventsourcing.py``: a script's folder comes first on ``sys.path``, so that name would hide the
library itself from ``bench/append.py``.

Both application recorders are made the library's way, from the same environment but for
``PERSISTENCE_MODULE`` and the schema: ``event_store.eventsourcing`` (events into the event
store's outbox with per-application notification ids) and ``eventsourcing.postgres`` (its own
table, ``LOCK TABLE`` per insert). Cases, each writer its own process, in interleaved rounds
(the machine is shared); the median events/s per case and the ratio module / library:

- ``insert_events`` of 1 event (1 and 4 writers), of 10 and of 1,000 events (1 writer);
  the events are what the library's JSON transcoder makes of a ~200-byte domain event;
- ``select_notifications`` of the whole log (``--reads`` events, written once per side) in
  pages of 10,000 and of 500 (a subscription's page): ``Notification`` objects with UUID
  originator ids and the state's bytes, what the library's readers get.
"""

import multiprocessing as mp
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from sqlalchemy import create_engine, text

from event_store.schema import drop_schema

TOPIC = "bench.domain:Post.Created"
MODULE = "event_store.eventsourcing"
LIBRARY = "eventsourcing.postgres"


def _state() -> bytes:
    from eventsourcing.persistence import DatetimeAsISO, JSONTranscoder

    transcoder = JSONTranscoder()
    transcoder.register(DatetimeAsISO())
    return transcoder.encode(
        {
            "post_id": 1,
            "author_id": 1,
            "text": "a post of some length #bench",
            "hashtags": ["bench"],
            "timestamp": datetime(2026, 11, 21, 23, 17, tzinfo=UTC),
        }
    )


def recorder_env(url: str, module: str, schema: str) -> dict[str, str]:
    """The environment that selects ``module`` on the database at ``url``."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return {
        "PERSISTENCE_MODULE": module,
        "POSTGRES_DBNAME": u.database or "postgres",
        "POSTGRES_HOST": u.host or "127.0.0.1",
        "POSTGRES_PORT": str(u.port or 5432),
        "POSTGRES_USER": u.username or "postgres",
        "POSTGRES_PASSWORD": u.password or "",
        "POSTGRES_SCHEMA": schema,
        "POSTGRES_POOL_SIZE": "1",
    }


def application_recorder(env: dict[str, str]) -> tuple[Any, Any]:
    """(factory, application recorder) of the application ``Bench``, the library's way."""
    from eventsourcing.persistence import InfrastructureFactory
    from eventsourcing.utils import Environment

    factory = InfrastructureFactory.construct(Environment("Bench", env))
    return factory, factory.application_recorder()


def _writer(env: dict[str, str], per: int, start: Any, seconds: float, out: Any) -> None:
    try:
        from eventsourcing.persistence import StoredEvent

        _, recorder = application_recorder(env)
        state = _state()
        streams = [uuid.uuid4() for _ in range(50)]
        versions = dict.fromkeys(streams, 0)

        def one(i: int) -> None:
            stream = streams[i % len(streams)]
            v = versions[stream]
            recorder.insert_events(
                [StoredEvent(stream, v + k + 1, TOPIC, state) for k in range(per)]
            )
            versions[stream] = v + per

        for i in range(5):  # warm up: connections, prepared statements
            one(i)
        start.wait()
        began = time.perf_counter()
        deadline = began + seconds
        i = 5
        while time.perf_counter() < deadline:
            one(i)
            i += 1
        out.put(((i - 5) * per, time.perf_counter() - began))
    except BaseException as exc:
        out.put(f"{type(exc).__name__}: {exc}")
        raise


def append_case(env: dict[str, str], writers: int, per: int, seconds: float) -> float:
    """Events/s of ``writers`` processes inserting ``per`` events per call."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(writers), ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(env, per, start, seconds, out)) for _ in range(writers)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    failed = [r for r in results if isinstance(r, str)]
    if failed:
        raise RuntimeError(f"a writer failed: {failed[0]}")
    return sum(float(n) for n, _ in results) / max(float(t) for _, t in results)


def write_log(env: dict[str, str], count: int) -> None:
    """``count`` events in the application's log, 1,000 per insert."""
    from eventsourcing.persistence import StoredEvent

    factory, recorder = application_recorder(env)
    state = _state()
    for b in range(0, count, 1000):
        stream = uuid.uuid4()
        recorder.insert_events(
            [StoredEvent(stream, k + 1, TOPIC, state) for k in range(min(1000, count - b))]
        )
    factory.close()


def read_case(recorder: Any, page: int) -> float:
    """Events/s of reading the whole log with ``select_notifications`` in pages of ``page``."""
    began = time.perf_counter()
    count, start = 0, 1
    while notifications := recorder.select_notifications(start, page):
        count += len(notifications)
        start = notifications[-1].id + 1
    return count / (time.perf_counter() - began)


def compare(url: str, seconds: float = 4.0, rounds: int = 3, reads: int = 200_000) -> None:
    """Measure both sides and print the medians and the ratios module / library."""
    tag = uuid.uuid4().hex[:8]
    schemas = {
        "module": f"bench_esmod_{tag}",
        "library": f"bench_eslib_{tag}",
        "module reads": f"bench_esmodr_{tag}",
        "library reads": f"bench_eslibr_{tag}",
    }
    engine = create_engine(url)
    with engine.begin() as conn:
        for key in ("library", "library reads"):
            conn.execute(text(f"CREATE SCHEMA {schemas[key]}"))
    envs = {
        key: recorder_env(url, MODULE if key.startswith("module") else LIBRARY, schema)
        for key, schema in schemas.items()
    }
    try:
        for env in envs.values():
            factory, _ = application_recorder(env)  # creates the tables
            factory.close()
        print(f"writing {reads:,} events per side for the reads ...", flush=True)
        for key in ("module reads", "library reads"):
            write_log(envs[key], reads)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE"))
        readers = {
            key: application_recorder(envs[key]) for key in ("module reads", "library reads")
        }
        runs: dict[str, Callable[[], float]] = {}
        for side in ("module", "library"):
            for writers, per in ((1, 1), (4, 1), (1, 10), (1, 1000)):
                label = f"{side} insert {per}/call, {writers} writer(s)"
                runs[label] = partial(append_case, envs[side], writers, per, seconds)
            for page in (10_000, 500):
                runs[f"{side} select_notifications, pages of {page:,}"] = partial(
                    read_case, readers[f"{side} reads"][1], page
                )
        samples: dict[str, list[float]] = {label: [] for label in runs}
        print(
            f"{rounds} round(s), appends {seconds:.0f} s per case and round, interleaved; "
            "median events/s",
            flush=True,
        )
        for r in range(rounds):
            for label, run in runs.items():
                samples[label].append(run())
            print(f"  round {r + 1}/{rounds} done", flush=True)
        for factory, _ in readers.values():
            factory.close()
        report(samples)
    finally:
        with engine.begin() as conn:
            for schema in schemas.values():
                drop_schema(conn, schema)
        engine.dispose()


def report(samples: dict[str, list[float]]) -> None:
    rate = {label: statistics.median(values) for label, values in samples.items()}
    for label, values in samples.items():
        spread = f"{min(values):>10,.0f} .. {max(values):>10,.0f}" if len(values) > 1 else ""
        print(f"  {label:<48} {rate[label]:>10,.0f} /s   {spread}")
    print("\nratios module / library: of the medians, and the median of each round's own ratio")
    for label in samples:
        if not label.startswith("module "):
            continue
        case = label.removeprefix("module ")
        theirs = f"library {case}"
        own = statistics.median(m / t for m, t in zip(samples[label], samples[theirs], strict=True))
        print(f"  {case:<41} {rate[label] / rate[theirs]:>5.2f}   per round {own:.2f}")
