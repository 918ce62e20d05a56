"""Commands per second through the command bus and HTTP ``POST /commands``, against pgbench.

Run: ``.venv/bin/python bench/commands.py [--seconds 4] [--rounds 3]``. Uses
``TRIBUTARY_POSTGRES_URL`` when set, else starts a PostgreSQL of its own and stops it
afterwards. Prints commands/s per case (medians of interleaved rounds: the machine is
shared) and each as a ratio to pgbench single-row INSERT commits with as many clients,
measured in the same run. A measurement, not a test.

One command, ``CreatePost`` of a new post by an existing author (the social domain's
handler checks the users table): per command the bus runs one transaction that reads
(the command id, the stream's snapshot and events, the author) and writes (the event,
the command record), so 0.5x pgbench is the ceiling and 0.4x the aim. Cases, each sender
its own process (so Python's GIL is not what is measured):

- ``bus``: ``CommandBus.send`` built as ``tributary`` builds it (``make_engine``: pooled,
  pre-ping on checkout), 1 and 4 senders;
- ``bus EditPost``: the same on 50 existing posts per sender (a load with events);
- ``http``: ``POST /commands`` of the HTTP API (``infra.http_api.create_app`` under
  uvicorn in a child process, as ``tributary serve`` runs it, over the same bus), driven by
  httpx from 1 and 4 sender processes; skipped when ``infra/http_api`` is absent.
"""

import argparse
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from append import PGBENCH_PLAIN, database, pgbench  # noqa: E402
from rounds import Rounds  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from event_store import create_schema, drop_schema  # noqa: E402

TEXT = "a post of some length #bench"


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # bus | edit | http
    senders: int


def _have_http_api() -> bool:
    return (ROOT / "infra" / "http_api").exists()


# -- the bus, as the command processor and the HTTP API build it ----------------------------


def build_bus(url: str, schema: str, users_schema: str) -> Any:
    from connectors.postgres import make_engine
    from examples.social import social_registry, users_table
    from infra.commands import command_bus
    from infra.settings import load_settings

    settings = load_settings(postgres_url=url, event_store_schema=schema)
    registry = social_registry(users_table(users_schema))
    return settings, command_bus(settings, make_engine(settings.postgres()), registry)


def _bus_sender(
    url: str, names: dict[str, str], case: Case, start: Any, seconds: float, out: Any
) -> None:
    from examples.social import CreatePost, EditPost

    _, bus = build_bus(url, names["store"], names["users"])
    base = uuid.uuid4().int % 2**40 * 1000
    if case.kind == "edit":
        for k in range(50):
            bus.send(CreatePost(base + k, 1, TEXT))

        def one(i: int) -> None:
            bus.send(EditPost(base + i % 50, f"{TEXT} {i}"))

    else:

        def one(i: int) -> None:
            bus.send(CreatePost(base + 50 + i, 1, TEXT))

    _timed(one, start, seconds, out)


def _http_sender(
    url: str, names: dict[str, str], case: Case, start: Any, seconds: float, out: Any
) -> None:
    import httpx

    base = uuid.uuid4().int % 2**40 * 1000
    with httpx.Client(base_url=names["http"], timeout=30) as client:

        def one(i: int) -> None:
            body = {
                "type": "CreatePost",
                "data": {"post_id": base + i, "author_id": 1, "text": TEXT},
            }
            response = client.post("/commands", json=body)
            if response.status_code != 200 or response.json().get("status") != "accepted":
                raise RuntimeError(f"POST /commands: {response.status_code} {response.text}")

        _timed(one, start, seconds, out)


def _timed(one: Callable[[int], None], start: Any, seconds: float, out: Any) -> None:
    for i in range(5):  # warm up: connections, prepared statements
        one(i)
    start.wait()
    began = time.perf_counter()
    deadline = began + seconds
    i = 5
    while time.perf_counter() < deadline:
        one(i)
        i += 1
    out.put((i - 5, time.perf_counter() - began))


SENDERS = {"bus": _bus_sender, "edit": _bus_sender, "http": _http_sender}


def _sender(kind: str, *args: Any) -> None:
    out = args[5]
    try:
        SENDERS[kind](*args)
    except BaseException as exc:
        out.put(f"{type(exc).__name__}: {exc}")
        raise


def run_case(url: str, names: dict[str, str], case: Case, seconds: float) -> float:
    """Commands per second over all senders."""
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(case.senders)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_sender, args=(case.kind, url, names, case, start, seconds, out))
        for _ in range(case.senders)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    failed = [r for r in results if isinstance(r, str)]
    if failed:
        raise RuntimeError(f"{case.name}: a sender failed: {failed[0]}")
    return sum(float(n) for n, _ in results) / max(float(t) for _, t in results)


# -- the HTTP API in a child process --------------------------------------------------------


def serve(url: str, schema: str, users_schema: str, port: int) -> None:
    """What ``tributary serve`` runs (create_app under uvicorn), over the bench's bus and
    without views (the bench sends commands only)."""
    import uvicorn

    from infra.http_api import create_app

    settings, bus = build_bus(url, schema, users_schema)
    app = create_app(settings, views=[], bus=bus)
    uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")).run()


@contextmanager
def http_server(url: str, names: dict[str, str]) -> Iterator[str]:
    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, __file__, "--serve", url, names["store"], names["users"], str(port)]
    server = subprocess.Popen(argv, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the HTTP API exited with {server.returncode}")
            try:
                httpx.get(f"{base}/docs", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the HTTP API did not answer within 60 s") from None
                time.sleep(0.2)
        yield base
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


# -- set-up -----------------------------------------------------------------------------


def prepare(url: str, tag: str) -> dict[str, str]:
    from examples.social import create_users_table, upsert_user

    names = {
        "store": f"bench_cmd_{tag}",
        "users": f"bench_cmd_users_{tag}",
        "pgbench": f"bench_cmd_pgbench_{tag}",
    }
    engine = create_engine(url)
    with engine.begin() as conn:
        create_schema(conn, names["store"])
        users = create_users_table(conn, names["users"])
        upsert_user(conn, users, 1, "bench")
        conn.execute(
            text(f"CREATE TABLE public.{names['pgbench']} (id bigserial PRIMARY KEY, payload text)")
        )
    engine.dispose()
    return names


def cleanup(url: str, names: dict[str, str]) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        drop_schema(conn, names["store"])
        drop_schema(conn, names["users"])
        conn.execute(text(f"DROP TABLE IF EXISTS public.{names['pgbench']}"))
    engine.dispose()


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="duration of each case")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--no-http", action="store_true", help="skip the HTTP cases")
    args = parser.parse_args()
    with database() as url:
        names = prepare(url, uuid.uuid4().hex[:8])
        try:
            if _have_http_api() and not args.no_http:
                with http_server(url, names) as base:
                    report(url, names | {"http": base}, args.seconds, args.rounds)
            else:
                print("infra/http_api is absent (or --no-http): the HTTP cases are skipped")
                report(url, names, args.seconds, args.rounds)
        finally:
            cleanup(url, names)


def report(url: str, names: dict[str, str], seconds: float, rounds: int) -> None:
    cases = [Case(f"bus CreatePost, {n} sender(s)", "bus", n) for n in (1, 4)]
    cases += [Case(f"bus EditPost, {n} sender(s)", "edit", n) for n in (1, 4)]
    if "http" in names:
        cases += [Case(f"http CreatePost, {n} sender(s)", "http", n) for n in (1, 4)]
    plain = PGBENCH_PLAIN.format(table=names["pgbench"])
    runs: dict[str, Callable[[], float]] = {}
    for n in (1, 4):  # each baseline right before the cases it is the baseline of
        runs[f"pgbench insert, {n} client(s)"] = partial(pgbench, url, plain, n, seconds)
        for case in (c for c in cases if c.senders == n):
            runs[case.name] = partial(run_case, url, names, case, seconds)
    print(
        f"{rounds} round(s), each case {seconds:.0f} s per round, rounds interleaved; median "
        "commands/s (pgbench: single-row INSERT commits/s)",
        flush=True,
    )
    measured = Rounds(runs).run(rounds)
    measured.print_rates(34)
    print(
        "\nratios (aim >= 0.4; one read and one write transaction per command: 0.5 is the "
        "limit): of the medians, and the median of each round's own ratio (steadier when "
        "the machine's load changes between rounds)"
    )
    for case in cases:
        baseline = f"pgbench insert, {case.senders} client(s)"
        of_medians, per_round = measured.ratio(case.name, baseline)
        print(f"  {case.name} / {baseline}: {of_medians:.2f}   per round {per_round:.2f}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
