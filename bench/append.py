"""Event store appends and reads against pgbench, a raw COPY and the eventsourcing library.

Run: ``.venv/bin/python bench/append.py [--seconds 4] [--rounds 3] [--reads 200000]
[--only appends|reads|eventsourcing]``. Uses ``TRIBUTARY_POSTGRES_URL`` when set, else starts
a PostgreSQL of its own (``LocalStack`` with isolated settings) and stops it afterwards. Cases
run in interleaved rounds (the machine is shared); it prints the median events/s per case and
the ratios to the baselines measured in the same run. A measurement, not a test.

Cases (each writer is its own process, so Python's GIL is not what is measured):

- ``append 1/cmd``: one event per append (what one command decides), 1 and 4 writers;
- ``append 10`` and ``append 1000``: events per append, 1 writer;
- ``bus 1/cmd``: the full command path (id check, load, decide, append + command record);
- ``no-order``: the same appends with the read_all mechanism removed (no transaction id
  default, no ordering index): the cost of never skipping on read;
- ``lock``: appends serialised by a transaction-scoped lock, the alternative mechanism;
- ``pgbench``: single-row INSERT commits, 1 and 4 clients, into a one-column table, and
  ("event row") into an events table of our schema: the second separates the cost of the
  row (its indexes, jsonb) from the cost of our client code; ``pgbench 1000 event rows``:
  1,000 rows made by the server in one INSERT (printed as rows/s), the database's own speed
  for a 1,000-event append;
- ``psycopg``: the one-column INSERT from Python (the floor for any Python client);
- ``eventsourcing``: ``PostgresApplicationRecorder.insert_events`` run the same way.

Reads (``--reads`` events, written with the social domain's event shape: ~200 bytes of
data, a command id in the metadata; 1,000 per append and per stream), in two tables of the
same rows: ``analysed`` (``VACUUM ANALYZE`` after the writes) and ``fresh`` (as a bulk
append leaves it: never analysed, its autovacuum off so that none analyses it during the
run; the bench checks that it has no statistics at the end). Each read runs on both, and
is printed as a ratio to the raw COPY of the same table in the same round:

- ``raw COPY``: ``COPY (the read_all query) TO STDOUT (FORMAT binary)``, the bytes only;
  the speed of the table, the baseline of the reads;
- ``read_all``: pages of 10,000 :class:`RecordedEvent` (fields decoded on use), then the
  same touching every event's ``data``;
- ``read_batches``: Arrow record batches of four columns, no object per event;
- on the analysed table only: ``read_all as before`` (the SQLAlchemy-row implementation
  the fast path replaced) and ``eventsourcing``: its notification log,
  ``select_notifications`` in pages of 10,000 (the same rows in the library's table).

Needs ``pip install -e '.[bench]'`` for the eventsourcing comparison (skipped without it).

``--only eventsourcing`` (also run last without ``--only``): the persistence module
``event_store.eventsourcing`` against the library's own PostgreSQL module, appends and
notification reads (``bench/eventsourcing_persistence.py``).
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

from bench.stopping import stop_cleanly_on_sigterm
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


# -- reads ------------------------------------------------------------------------------

READ_PAGE = 10_000


def read_event(n: int) -> NewEvent:
    """An event of the social domain's shape."""
    data = {
        "post_id": n,
        "author_id": n % 97,
        "text": f"a post of some length #bench {n}",
        "hashtags": ["bench"],
        "created_at": "2026-11-21T23:17:00.123456Z",
    }
    metadata = {"command_id": str(uuid.uuid4()), "command_type": "CreatePost"}
    return NewEvent("PostCreated", data, 2, metadata)


def prepare_reads(url: str, names: dict[str, str], count: int, have_lib: bool) -> None:
    """``count`` events in each read schema (1,000 per append, 1,000 per stream): the
    fresh one never analysed, the other analysed; the same in the eventsourcing library's
    table."""
    engine = create_engine(url)
    with engine.begin() as conn:  # no autovacuum, hence no autoanalyze, on the fresh table
        conn.execute(
            text(f"ALTER TABLE {names['read_fresh']}.events SET (autovacuum_enabled = off)")
        )
    batches = []
    for schema in (names["read"], names["read_fresh"]):
        store = EventStore(engine, schema)
        for b in range(0, count, 1000):
            batch = [read_event(b + k) for k in range(min(1000, count - b))]
            store.append(f"post-{b}", batch, 0, stream_type="post")
            if schema == names["read"]:
                batches.append(batch)
    with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text(f"VACUUM ANALYZE {names['read']}.events"))
    engine.dispose()
    if not have_lib:
        return
    from eventsourcing.persistence import StoredEvent

    recorder = eventsourcing_recorder(url, names["read_lib"])
    for batch in batches:
        stream = uuid.uuid4()
        recorder.insert_events(
            [
                StoredEvent(stream, k + 1, "social:PostCreated", json.dumps(e.data).encode())
                for k, e in enumerate(batch)
            ]
        )


def _read_raw_copy(url: str, schema: str) -> int:
    import psycopg

    from event_store.reading import HORIZON, SELECT_EVENT

    query = (
        f"COPY (SELECT {SELECT_EVENT} FROM {schema}.events WHERE {HORIZON} "
        "ORDER BY transaction_id, position) TO STDOUT (FORMAT binary)"
    )
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as conn, conn.cursor() as cursor:
        with cursor.copy(query) as copy:
            for _ in copy:
                pass
        return cursor.rowcount  # "COPY n"


def _read_all(store: EventStore, touch: bool) -> int:
    count, after = 0, None
    while page := store.read_all(after, limit=READ_PAGE):
        count += len(page)
        after = page[-1].position
        if touch:
            for event in page:
                event.data  # noqa: B018  (decodes it)
    return count


def _read_batches(store: EventStore) -> int:
    columns = ("stream_id", "event_type", "version", "data")
    return sum(b.num_rows for b in store.read_batches(columns, batch_size=READ_PAGE))


def _read_all_before(engine: Any, schema: str) -> int:
    """``read_all`` as it was: a SQLAlchemy Core SELECT, rows mapped to events."""
    from sqlalchemy import BigInteger, Text, cast, func, select, tuple_

    from event_store import Position, RecordedEvent
    from event_store.schema import StoreTables

    t = StoreTables(schema).events
    horizon = cast(cast(func.pg_snapshot_xmin(func.pg_current_snapshot()), Text), BigInteger)
    count, after = 0, None
    while True:
        query = select(t).where(t.c.transaction_id < horizon)
        if after is not None:
            query = query.where(
                tuple_(t.c.transaction_id, t.c.position)
                > tuple_(after.transaction_id, after.sequence)
            )
        query = query.order_by(t.c.transaction_id, t.c.position).limit(READ_PAGE)
        with engine.connect() as conn:
            rows = conn.execute(query).all()
        if not rows:
            return count
        page = [
            RecordedEvent.from_columns([r._mapping[c] for c in RecordedEvent.COLUMNS]) for r in rows
        ]
        count += len(page)
        after = Position(page[-1].position.transaction_id, page[-1].position.sequence)


def _read_eventsourcing(recorder: Any) -> int:
    count, start = 0, 1
    while notifications := recorder.select_notifications(start, READ_PAGE):
        count += len(notifications)
        start = notifications[-1].id + 1
    return count


def read_case(read: Callable[[], int]) -> float:
    """Events per second of one full read."""
    began = time.perf_counter()
    count = read()
    return count / (time.perf_counter() - began)


#: The reads measured on each table, compared with its raw COPY.
READS = ("read_all", "read_all, touching data", "read_batches (Arrow)")
#: The two tables of the same rows: analysed, and as a bulk append leaves them.
READ_TABLES = {"analysed": "read", "fresh": "read_fresh"}


def read_runs(url: str, names: dict[str, str], have_lib: bool) -> dict[str, Callable[[], float]]:
    import pyarrow  # noqa: F401  (imported before the clock starts, not by the first read)

    engine = create_engine(url, pool_size=2)
    runs: dict[str, Callable[[], float]] = {}
    for table, key in READ_TABLES.items():
        store = EventStore(engine, names[key])
        runs |= {
            f"raw COPY (binary), {table}": partial(
                read_case, partial(_read_raw_copy, url, names[key])
            ),
            f"read_all, {table}": partial(read_case, partial(_read_all, store, False)),
            f"read_all, touching data, {table}": partial(
                read_case, partial(_read_all, store, True)
            ),
            f"read_batches (Arrow), {table}": partial(read_case, partial(_read_batches, store)),
        }
    runs["read_all as before, analysed"] = partial(
        read_case, partial(_read_all_before, engine, names["read"])
    )
    if have_lib:
        recorder = eventsourcing_recorder(url, names["read_lib"])
        runs["eventsourcing notifications"] = partial(
            read_case, partial(_read_eventsourcing, recorder)
        )
    return runs


def fresh_table_statistics(url: str, names: dict[str, str]) -> str:
    """When the fresh table was analysed, if ever (it must not have been)."""
    engine = create_engine(url)
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT last_analyze, last_autoanalyze, "
                "(SELECT count(*) FROM pg_stats WHERE schemaname = :s AND tablename = 'events') "
                "FROM pg_stat_user_tables WHERE schemaname = :s AND relname = 'events'"
            ),
            {"s": names["read_fresh"]},
        ).one()
    engine.dispose()
    if row[0] is None and row[1] is None and row[2] == 0:
        return "never analysed, no statistics (as right after a bulk append)"
    return f"ANALYSED during the run ({row[0] or row[1]}, {row[2]} column statistics)"


# -- pgbench ----------------------------------------------------------------------------


PGBENCH_PLAIN = "INSERT INTO public.{table} (payload) VALUES ('{{\"post_id\": 1}}');\n"


def _times(factor: int, run: Callable[..., float], *args: Any) -> float:
    return factor * run(*args)


def pgbench_event_row(schema: str) -> str:
    """One event row into a store schema's events table, as pgbench runs it."""
    return (
        f"INSERT INTO {schema}.events (event_id, stream_id, stream_type, version, event_type, "
        "schema_version, data, metadata) VALUES (gen_random_uuid(), 's-' || gen_random_uuid(), "
        f"'bench', 1, 'Benched', 1, '{json.dumps(PAYLOAD)}', '{{}}') "
        "RETURNING transaction_id, position;\n"
    )


def pgbench_event_rows(schema: str, count: int) -> str:
    """``count`` event rows of one new stream in one INSERT (made by the server, no client
    in the way): the database's own speed for a ``count``-event append."""
    return (
        f"INSERT INTO {schema}.events (event_id, stream_id, stream_type, version, event_type, "
        "schema_version, data, metadata) SELECT gen_random_uuid(), s.id, 'bench', g, 'Benched', "
        f"1, '{json.dumps(PAYLOAD)}', '{{}}' FROM generate_series(1, {count}) g, "
        "(SELECT 's-' || gen_random_uuid() AS id) s RETURNING transaction_id, position;\n"
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
    from infra.stack.isolated import isolated_settings

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
        "read": f"bench_read_{tag}",
        "read_fresh": f"bench_read_fresh_{tag}",
        "read_lib": f"bench_readlib_{tag}",
    }
    engine = create_engine(url)
    with engine.begin() as conn:
        for key in ("store", "noorder", "bus", "pgbench_events", "read", "read_fresh"):
            create_schema(conn, names[key])
        n = names["noorder"]
        conn.execute(text(f"DROP INDEX {n}.events_transaction_position_idx"))
        conn.execute(text(f"ALTER TABLE {n}.events ALTER COLUMN transaction_id SET DEFAULT 0"))
        from examples.social import create_users_table, upsert_user

        users = create_users_table(conn, names["bus"] + "_users")
        upsert_user(conn, users, 1, "bench")
        conn.execute(text(f"CREATE SCHEMA {names['es_lib']}"))
        conn.execute(text(f"CREATE SCHEMA {names['read_lib']}"))
    with suppress(ImportError):
        eventsourcing_recorder(url, names["es_lib"]).create_table()
        eventsourcing_recorder(url, names["read_lib"]).create_table()
    with engine.begin() as conn:
        conn.execute(
            text(f"CREATE TABLE public.{names['pgbench']} (id bigserial PRIMARY KEY, payload text)")
        )
    engine.dispose()
    return names


def cleanup(url: str, names: dict[str, str]) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        keys = ("store", "noorder", "bus", "es_lib", "pgbench_events", "read", "read_fresh")
        for key in (*keys, "read_lib"):
            drop_schema(conn, names[key])
        drop_schema(conn, names["bus"] + "_users")
        conn.execute(text(f"DROP TABLE IF EXISTS public.{names['pgbench']}"))
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="duration of each case")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--reads", type=int, default=200_000, help="events for the reads")
    parser.add_argument(
        "--only",
        choices=("appends", "reads", "eventsourcing"),
        help="one part only (eventsourcing: the persistence module event_store.eventsourcing "
        "against the library's PostgreSQL recorder, bench/eventsourcing_persistence.py)",
    )
    args = parser.parse_args()
    seconds = args.seconds
    try:
        import eventsourcing  # noqa: F401

        have_lib = True
    except ImportError:
        have_lib = False
        print("eventsourcing is not installed (pip install -e '.[bench]'): skipping it")

    with database() as url:
        if args.only != "eventsourcing":
            names = prepare(url, uuid.uuid4().hex[:8])
            try:
                if args.only != "appends":
                    print(f"writing {args.reads:,} events for the reads ...", flush=True)
                    prepare_reads(url, names, args.reads, have_lib)
                report(url, names, seconds, args.rounds, have_lib, args.only)
            finally:
                cleanup(url, names)
        if have_lib and args.only in (None, "eventsourcing"):
            from eventsourcing_persistence import compare

            print("\n== event_store.eventsourcing against the library's PostgreSQL module")
            compare(url, seconds, args.rounds, args.reads)


def report(
    url: str,
    names: dict[str, str],
    seconds: float,
    rounds: int,
    have_lib: bool,
    only: str | None = None,
) -> None:
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
    for c in (1, 4):  # the baselines right before the cases of as many writers
        runs[f"pgbench insert, {c} client(s)"] = partial(pgbench, url, plain, c, seconds)
        runs[f"pgbench event row, {c} client(s)"] = partial(pgbench, url, event_row, c, seconds)
        if c == 1:
            rows = pgbench_event_rows(names["pgbench_events"], 1000)
            runs["pgbench 1000 event rows, 1 client"] = partial(
                _times, 1000, pgbench, url, rows, c, seconds
            )
        for case in (k for k in cases if k.writers == c):
            runs[case.name] = partial(run_case, url, case, seconds)
    if only == "reads":
        runs = {}
    if only != "appends":
        runs.update(read_runs(url, names, have_lib))
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

    print(
        "\nratios: of the medians, and the median of each round's own ratio (steadier when "
        "the machine's load changes between rounds)"
    )

    def ratio(a: str, b: str, aim: str = "") -> None:
        if a in rate and b in rate:
            own = statistics.median(x / y for x, y in zip(samples[a], samples[b], strict=True))
            print(f"  {a} / {b}: {rate[a] / rate[b]:.2f}   per round {own:.2f}{aim}")

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
    if "append 1000/append, 1 writer" in rate:
        big = rate["append 1000/append, 1 writer"]
        print(f"  append 1000/append: {big:,.0f} events/s (aim >= 50,000)")
    ratio(
        "append 1000/append, 1 writer",
        "pgbench 1000 event rows, 1 client",
        "  (the same rows made by the server: the database's own speed)",
    )
    ratio("append 1/cmd, 1 writer", "no-order 1/cmd, 1 writer", "  (cost of read_all ordering)")
    ratio("append 1/cmd, 4 writers", "no-order 1/cmd, 4 writers", "  (cost of read_all ordering)")
    ratio("append 1000/append, 1 writer", "no-order 1000/append, 1 writer", "  (cost of ordering)")
    ratio("lock 1/cmd, 4 writers", "append 1/cmd, 4 writers", "  (a global lock instead)")
    aims = {"read_all": "", "read_all, touching data": ">= 0.5", "read_batches (Arrow)": ">= 0.8"}
    for table in READ_TABLES:
        copy = f"raw COPY (binary), {table}"
        for read in READS:
            aim = aims[read]
            ratio(f"{read}, {table}", copy, f"  (aim {aim})" if aim else "")
    ratio("read_all as before, analysed", "raw COPY (binary), analysed")
    ratio("read_all, analysed", "read_all as before, analysed")
    ratio("read_all, fresh", "read_all, analysed", "  (fresh table / analysed table)")
    ratio("read_all, analysed", "eventsourcing notifications")
    ratio("read_all, touching data, analysed", "eventsourcing notifications")
    ratio("read_batches (Arrow), analysed", "eventsourcing notifications")
    for table in READ_TABLES:
        if f"read_all, {table}" in rate:
            got = rate[f"read_all, {table}"]
            print(f"  read_all, {table}: {got:,.0f} events/s (aim >= 400,000)")
    if "read_all, fresh" in rate:
        print(f"  the fresh table at the end: {fresh_table_statistics(url, names)}")
    for ours, theirs in [
        ("append 1/cmd, 1 writer", "eventsourcing 1/cmd, 1 writer"),
        ("append 1/cmd, 4 writers", "eventsourcing 1/cmd, 4 writers"),
        ("append 10/append, 1 writer", "eventsourcing 10/append, 1 writer"),
        ("append 1000/append, 1 writer", "eventsourcing 1000/append, 1 writer"),
    ]:
        ratio(ours, theirs)


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
