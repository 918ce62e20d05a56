"""Event store append throughput against pgbench and the eventsourcing library, same database.

Run: ``.venv/bin/python bench/append.py [--seconds 5]``. Uses ``TRIBUTARY_POSTGRES_URL`` when
set, else starts a PostgreSQL of its own (``LocalStack`` with isolated settings) and stops it
afterwards. Prints events/s per case and the ratios; it is a measurement, not a test.

Cases (each writer is its own process, so Python's GIL is not what is measured):

- ``append 1/cmd``: one event per append (what one command decides), 1 and 4 writers;
- ``append 10`` and ``append 1000``: events per append, 1 writer;
- ``bus 1/cmd``: the full command path (id check, load, decide, append + command record);
- ``no-order``: the same appends with the read_all mechanism removed (no transaction id
  default, no ordering index): the cost of never skipping on read;
- ``lock``: appends serialised by a transaction-scoped lock, the alternative mechanism;
- ``pgbench``: single-row INSERT commits, 1 and 4 clients, into a one-column table, and
  ("event row") into an events table of our schema: the second separates the cost of the
  row (its indexes, jsonb) from the cost of our client code;
- ``psycopg``: the one-column INSERT from Python (the floor for any Python client);
- ``eventsourcing``: ``PostgresApplicationRecorder.insert_events`` run the same way.

Needs ``pip install -e '.[bench]'`` for the eventsourcing comparison (skipped without it).
"""

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from event_store import (
    CommandBus,
    EventStore,
    NewEvent,
    SnapshotPolicy,
    create_schema,
    drop_schema,
)

PGBENCH = "/usr/lib/postgresql/15/bin/pgbench"
PAYLOAD = {"post_id": 1, "author_id": 1, "text": "a post of some length #bench", "n": 0}


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # append | bus | lock | eventsourcing
    writers: int
    per_append: int
    schema: str


# -- workers (run in child processes) ---------------------------------------------------


def _engine(url: str) -> Any:
    return create_engine(url, pool_size=2, pool_pre_ping=False)


def _store_writer(url: str, case: Case, start: Any, seconds: float, out: Any, worker: int) -> None:
    engine = _engine(url)
    store = EventStore(engine, case.schema)
    versions: dict[str, int] = {}
    streams = [f"w{worker}-{uuid.uuid4().hex[:8]}-{i}" for i in range(50)]

    def one(i: int) -> None:
        stream = streams[i % len(streams)]
        version = versions.get(stream, 0)
        batch = [NewEvent("Benched", PAYLOAD) for _ in range(case.per_append)]
        if case.kind == "lock":
            with engine.begin() as conn:
                conn.execute(text("SELECT pg_advisory_xact_lock(424242)"))
                store.append(stream, batch, version, stream_type="bench", connection=conn)
        else:
            store.append(stream, batch, version, stream_type="bench")
        versions[stream] = version + case.per_append

    _timed(one, start, seconds, out, case.per_append)


def _bus_writer(url: str, case: Case, start: Any, seconds: float, out: Any, worker: int) -> None:
    from examples.social import CreatePost, EditPost, social_registry, users_table

    engine = _engine(url)
    registry = social_registry(users_table(case.schema + "_users"))
    bus = CommandBus(EventStore(engine, case.schema), registry, SnapshotPolicy(100))
    base = worker * 1_000_000

    def one(i: int) -> None:
        post = base + i % 50
        command = CreatePost(post, 1, "hello #bench") if i < 50 else EditPost(post, f"edit {i}")
        bus.send(command)

    _timed(one, start, seconds, out, 1)


def eventsourcing_recorder(url: str, schema: str) -> Any:
    """The eventsourcing library's PostgreSQL application recorder (notification ids)."""
    from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore

    u = make_url(url)
    datastore = PostgresDatastore(
        u.database or "postgres",
        u.host or "127.0.0.1",
        u.port or 5432,
        u.username or "",
        u.password or "",
        pool_size=2,
        schema=schema,
    )
    return PostgresApplicationRecorder(datastore, events_table_name="stored_events")


def _eventsourcing_writer(
    url: str, case: Case, start: Any, seconds: float, out: Any, worker: int
) -> None:
    from eventsourcing.persistence import StoredEvent

    recorder = eventsourcing_recorder(url, case.schema)
    versions: dict[uuid.UUID, int] = {}
    streams = [uuid.uuid4() for _ in range(50)]
    state = json.dumps(PAYLOAD).encode()

    def one(i: int) -> None:
        stream = streams[i % len(streams)]
        version = versions.get(stream, 0)
        recorder.insert_events(
            [
                StoredEvent(stream, version + k + 1, "bench:Benched", state)
                for k in range(case.per_append)
            ]
        )
        versions[stream] = version + case.per_append

    _timed(one, start, seconds, out, case.per_append)


def _psycopg_writer(
    url: str, case: Case, start: Any, seconds: float, out: Any, worker: int
) -> None:
    """The floor for any Python client: one single-row INSERT per commit, plain psycopg."""
    import psycopg

    conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
    statement = f"INSERT INTO public.{case.schema} (payload) VALUES (%s)"

    def one(i: int) -> None:
        conn.execute(statement, ('{"post_id": 1}',))

    _timed(one, start, seconds, out, 1)


def _timed(one: Callable[[int], None], start: Any, seconds: float, out: Any, per: int) -> None:
    for i in range(5):  # warm up: connections, prepared statements
        one(i)
    start.wait()
    deadline = time.perf_counter() + seconds
    began = time.perf_counter()
    i = 5
    while time.perf_counter() < deadline:
        one(i)
        i += 1
    out.put(((i - 5) * per, time.perf_counter() - began))


WORKERS = {
    "append": _store_writer,
    "lock": _store_writer,
    "bus": _bus_writer,
    "eventsourcing": _eventsourcing_writer,
    "psycopg": _psycopg_writer,
}


def run_case(url: str, case: Case, seconds: float) -> float:
    """Events per second over all writers."""
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(case.writers)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(case.kind, url, case, start, seconds, out, w))
        for w in range(case.writers)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    failed = [r for r in results if isinstance(r, str)]
    if failed:
        raise RuntimeError(f"{case.name}: a writer failed: {failed[0]}")
    events = sum(float(n) for n, _ in results)
    return events / max(float(t) for _, t in results)


def _worker(kind: str, *args: Any) -> None:
    out = args[4]
    try:
        WORKERS[kind](*args)
    except BaseException as exc:
        out.put(f"{type(exc).__name__}: {exc}")
        raise


# -- pgbench ----------------------------------------------------------------------------


PGBENCH_PLAIN = "INSERT INTO public.{table} (payload) VALUES ('{{\"post_id\": 1}}');\n"


def pgbench_event_row(schema: str) -> str:
    """One event row into a store schema's events table, as pgbench runs it."""
    return (
        f"INSERT INTO {schema}.events (event_id, stream_id, stream_type, version, event_type, "
        "schema_version, data, metadata) VALUES (gen_random_uuid(), 's-' || gen_random_uuid(), "
        f"'bench', 1, 'Benched', 1, '{json.dumps(PAYLOAD)}', '{{}}') "
        "RETURNING transaction_id, position;\n"
    )


def pgbench(url: str, sql: str, clients: int, seconds: float) -> float:
    """Commits/s of ``sql`` run by pgbench (C client) with ``clients`` connections."""
    u = make_url(url)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write(sql)
    os.chmod(script.name, 0o644)
    env = {**os.environ, "PGPASSWORD": u.password or ""}
    argv = [
        PGBENCH,
        "-n",
        "-c",
        str(clients),
        "-j",
        str(clients),
        "-T",
        str(int(seconds)),
        "-f",
        script.name,
        "-h",
        u.host or "127.0.0.1",
        "-p",
        str(u.port or 5432),
        "-U",
        u.username or "postgres",
        u.database or "postgres",
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    finally:
        os.unlink(script.name)
    match = re.search(r"tps = ([\d.]+)", done.stdout)
    if match is None:
        raise RuntimeError(f"pgbench printed no tps:\n{done.stdout}\n{done.stderr}")
    return float(match.group(1))


# -- set-up -----------------------------------------------------------------------------


@contextmanager
def database() -> Iterator[str]:
    url = os.environ.get("TRIBUTARY_POSTGRES_URL")
    if url:
        yield url
        return
    from infra.stack import LocalStack
    from tests.stackenv import isolated_settings

    settings = isolated_settings("tributary-bench-")
    stack = LocalStack(settings)
    print("starting a PostgreSQL of its own ...", flush=True)
    stack.up(["postgres"])
    try:
        yield settings.database_url
    finally:
        stack.down()
        shutil.rmtree(settings.home.parent, ignore_errors=True)


def prepare(url: str, tag: str) -> dict[str, str]:
    names = {
        "store": f"bench_es_{tag}",
        "noorder": f"bench_es_noorder_{tag}",
        "bus": f"bench_bus_{tag}",
        "es_lib": f"bench_eslib_{tag}",
        "pgbench": f"bench_pgbench_{tag}",
        "pgbench_events": f"bench_pgbench_es_{tag}",
    }
    engine = create_engine(url)
    with engine.begin() as conn:
        for key in ("store", "noorder", "bus", "pgbench_events"):
            create_schema(conn, names[key])
        n = names["noorder"]
        conn.execute(text(f"DROP INDEX {n}.events_transaction_position_idx"))
        conn.execute(text(f"ALTER TABLE {n}.events ALTER COLUMN transaction_id SET DEFAULT 0"))
        from examples.social import create_users_table, upsert_user

        users = create_users_table(conn, names["bus"] + "_users")
        upsert_user(conn, users, 1, "bench")
        conn.execute(text(f"CREATE SCHEMA {names['es_lib']}"))
    with suppress(ImportError):
        eventsourcing_recorder(url, names["es_lib"]).create_table()
    with engine.begin() as conn:
        conn.execute(
            text(f"CREATE TABLE public.{names['pgbench']} (id bigserial PRIMARY KEY, payload text)")
        )
    engine.dispose()
    return names


def cleanup(url: str, names: dict[str, str]) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        for key in ("store", "noorder", "bus", "es_lib", "pgbench_events"):
            drop_schema(conn, names[key])
        drop_schema(conn, names["bus"] + "_users")
        conn.execute(text(f"DROP TABLE IF EXISTS public.{names['pgbench']}"))
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="duration of each case")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    args = parser.parse_args()
    seconds = args.seconds
    try:
        import eventsourcing  # noqa: F401

        have_lib = True
    except ImportError:
        have_lib = False
        print("eventsourcing is not installed (pip install -e '.[bench]'): skipping it")

    with database() as url:
        names = prepare(url, uuid.uuid4().hex[:8])
        try:
            report(url, names, seconds, args.rounds, have_lib)
        finally:
            cleanup(url, names)


def report(url: str, names: dict[str, str], seconds: float, rounds: int, have_lib: bool) -> None:
    s, nn = names["store"], names["noorder"]
    cases = [
        Case("psycopg insert, 1 writer", "psycopg", 1, 1, names["pgbench"]),
        Case("psycopg insert, 4 writers", "psycopg", 4, 1, names["pgbench"]),
        Case("append 1/cmd, 1 writer", "append", 1, 1, s),
        Case("append 1/cmd, 4 writers", "append", 4, 1, s),
        Case("append 10/append, 1 writer", "append", 1, 10, s),
        Case("append 1000/append, 1 writer", "append", 1, 1000, s),
        Case("bus 1/cmd, 1 writer", "bus", 1, 1, names["bus"]),
        Case("bus 1/cmd, 4 writers", "bus", 4, 1, names["bus"]),
        Case("no-order 1/cmd, 1 writer", "append", 1, 1, nn),
        Case("no-order 1/cmd, 4 writers", "append", 4, 1, nn),
        Case("no-order 1000/append, 1 writer", "append", 1, 1000, nn),
        Case("lock 1/cmd, 4 writers", "lock", 4, 1, s),
    ]
    if have_lib:
        lib = names["es_lib"]
        cases += [
            Case("eventsourcing 1/cmd, 1 writer", "eventsourcing", 1, 1, lib),
            Case("eventsourcing 1/cmd, 4 writers", "eventsourcing", 4, 1, lib),
            Case("eventsourcing 10/append, 1 writer", "eventsourcing", 1, 10, lib),
            Case("eventsourcing 1000/append, 1 writer", "eventsourcing", 1, 1000, lib),
        ]
    plain = PGBENCH_PLAIN.format(table=names["pgbench"])
    event_row = pgbench_event_row(names["pgbench_events"])
    runs: dict[str, Callable[[], float]] = {}
    for c in (1, 4):
        runs[f"pgbench insert, {c} client(s)"] = partial(pgbench, url, plain, c, seconds)
        runs[f"pgbench event row, {c} client(s)"] = partial(pgbench, url, event_row, c, seconds)
    runs.update({case.name: partial(run_case, url, case, seconds) for case in cases})
    samples: dict[str, list[float]] = {label: [] for label in runs}
    print(
        f"{rounds} round(s), each case {seconds:.0f} s per round, rounds interleaved; "
        "median events/s (pgbench and psycopg: single-row INSERT commits/s)",
        flush=True,
    )
    for r in range(rounds):
        for label, run in runs.items():
            samples[label].append(run())
        print(f"  round {r + 1}/{rounds} done", flush=True)
    rate = {label: statistics.median(values) for label, values in samples.items()}
    for label, values in samples.items():
        spread = f"{min(values):>9,.0f} .. {max(values):>9,.0f}" if len(values) > 1 else ""
        print(f"  {label:<38} {rate[label]:>10,.0f} /s   {spread}")

    print("\nratios")

    def ratio(a: str, b: str, aim: str = "") -> None:
        if a in rate and b in rate:
            print(f"  {a} / {b}: {rate[a] / rate[b]:.2f}{aim}")

    ratio("psycopg insert, 1 writer", "pgbench insert, 1 client(s)", "  (Python client floor)")
    ratio("psycopg insert, 4 writers", "pgbench insert, 4 client(s)", "  (Python client floor)")
    ratio("append 1/cmd, 1 writer", "pgbench insert, 1 client(s)", "  (aim >= 0.7)")
    ratio("append 1/cmd, 4 writers", "pgbench insert, 4 client(s)", "  (aim >= 0.7)")
    ratio("pgbench event row, 1 client(s)", "pgbench insert, 1 client(s)", "  (cost of the row)")
    ratio("pgbench event row, 4 client(s)", "pgbench insert, 4 client(s)", "  (cost of the row)")
    ratio("append 1/cmd, 1 writer", "pgbench event row, 1 client(s)", "  (same row, C client)")
    ratio("append 1/cmd, 4 writers", "pgbench event row, 4 client(s)", "  (same row, C client)")
    ratio("append 1/cmd, 1 writer", "psycopg insert, 1 writer")
    ratio("append 1/cmd, 4 writers", "psycopg insert, 4 writers")
    ratio("bus 1/cmd, 1 writer", "pgbench insert, 1 client(s)")
    ratio("bus 1/cmd, 4 writers", "pgbench insert, 4 client(s)")
    big = rate["append 1000/append, 1 writer"]
    print(f"  append 1000/append: {big:,.0f} events/s (aim >= 50,000)")
    ratio("append 1/cmd, 1 writer", "no-order 1/cmd, 1 writer", "  (cost of read_all ordering)")
    ratio("append 1/cmd, 4 writers", "no-order 1/cmd, 4 writers", "  (cost of read_all ordering)")
    ratio("append 1000/append, 1 writer", "no-order 1000/append, 1 writer", "  (cost of ordering)")
    ratio("lock 1/cmd, 4 writers", "append 1/cmd, 4 writers", "  (a global lock instead)")
    for ours, theirs in [
        ("append 1/cmd, 1 writer", "eventsourcing 1/cmd, 1 writer"),
        ("append 1/cmd, 4 writers", "eventsourcing 1/cmd, 4 writers"),
        ("append 10/append, 1 writer", "eventsourcing 10/append, 1 writer"),
        ("append 1000/append, 1 writer", "eventsourcing 1000/append, 1 writer"),
    ]:
        ratio(ours, theirs)


if __name__ == "__main__":
    main()
