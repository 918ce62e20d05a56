"""The chaos harness: kill -9 each part in turn under a steady workload; see :mod:`tests.chaos`.

.venv/bin/python -m tests.chaos [--trials 20] [--parts supervisor,cdc,...] [--keep]
"""

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
from rich.console import Console
from rich.table import Table

from connectors.postgres import make_engine
from event_store import create_schema
from event_store.command_topic import CommandClient, ensure_topics
from examples.social import prepare_database
from infra.command_results import Results
from infra.commands import command_topics
from infra.polling import poll_until
from infra.settings import Settings
from infra.stack import LocalStack
from infra.stack.isolated import isolated_settings, settings_env
from infra.stack.process import children, is_alive
from infra.verify import verify
from infra.views import views_config
from projections.view import View
from tests.chaos.compare import Diffs, compare_all, new_since, totals
from tests.chaos.loss import TailLoss
from tests.chaos.workload import USERS, Workload, add_user, post_command
from tributary.errors import TributaryError
from views.catalog import configured_views

SUPERVISED = ("cdc", "commands", "views", "api")
SERVICES = ("postgres", "redis", "broker", "objectstore")
LOSS = "broker-loss"  # kill -9 of the broker, which loses its last acknowledged records
LOAD = "load"  # no kill: 16 senders without pause (item 5), then the views must converge
LOAD_SENDERS = 16
PARTS = ("supervisor", *SUPERVISED, *SERVICES, LOSS, LOAD)
LOSSY = ("broker", "objectstore", LOSS)  # kill -9 may lose acknowledged records: repair after
LOSS_WINDOW_S = 1.0  # broker-loss: the batches the data topics received this long before the kill
PROBE_AUTHOR, PROBE_FOLLOWER = 900_001, 900_002
RECOVERY_TIMEOUT_S = 600.0
CONVERGE_TIMEOUT_S = 420.0
STARTED = re.compile(r"run: (\w+): started \(pid (\d+)\)")

console = Console(width=200, log_path=False)


def say(line: str) -> None:
    console.log(line, markup=False, highlight=False)


@dataclass
class Row:
    part: str
    trials: int = 0
    lost: int = 0
    twice: int = 0
    recoveries: list[float] = field(default_factory=list)
    unrecovered: int = 0
    examples: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)  # broker-loss: events, changes lost
    named: str = "-"  # what verify named before repair (the lossy parts)
    short: int | None = None  # what the views lacked before repair (the lossy parts)
    converged_s: float = 0.0  # from the pause of the workload until the views equal the reference
    repaired: str = "-"  # what repair did

    @property
    def failed(self) -> bool:
        return self.lost > 0 or self.twice > 0 or self.unrecovered > 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (read from /proc), children first."""
    out: list[int] = []
    todo = [pid]
    while todo:
        found = children(todo.pop())
        out += found
        todo += found
    return out


def wait_until(check: Callable[[], object], timeout: float, what: str, every: float = 0.5) -> float:
    """Poll ``check`` while the parts restart (any exception counts as not yet): seconds taken,
    :class:`TimeoutError` when late."""
    return poll_until(check, timeout, what, every, retry_on=(Exception,))


class Harness:
    def __init__(
        self, trials: int, parts: list[str], keep: bool, seed: int, load_s: float = 120.0
    ) -> None:
        self.trials, self.parts, self.keep, self.load_s = trials, parts, keep, load_s
        self.rng = random.Random(seed)
        self.s: Settings = isolated_settings(
            "tributary-chaos-", api_port=free_port(), verify_interval_s=0.0
        )
        self.env = {
            **settings_env(self.s),
            "TRIBUTARY_API_PORT": str(self.s.api_port),
            "TRIBUTARY_VERIFY_INTERVAL_S": "0",
            "COLUMNS": "200",
        }
        self.stack = LocalStack(self.s)
        self.api = f"http://127.0.0.1:{self.s.api_port}"
        self.logs = self.s.home.parent / "harness"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.supervisor: subprocess.Popen[bytes] | None = None
        self.supervisor_log = self.logs / "run-0.out"
        self.generation = 0
        self.views: dict[str, View] = {}
        self.results: Results | None = None
        self.workload: Workload | None = None
        self.last: Diffs = {}
        self.probe_post = 800_000_000
        self.defects: list[str] = []
        self.tail = TailLoss(
            self.stack.objectstore.filer_url,
            self.stack.broker.bucket,
            (self.s.event_topic_prefix, f"{self.s.cdc_topic_prefix}."),
        )

    # -- set-up and tear-down ------------------------------------------------------------

    def setup(self) -> None:
        say(f"state folder {self.s.home}; starting the local stack")
        self.stack.up()
        engine = make_engine(self.s.postgres())
        with engine.begin() as conn:
            prepare_database(conn)
            create_schema(conn, self.s.event_store_schema)
        engine.dispose()
        with psycopg.connect(self.s.postgres().dsn, autocommit=True) as conn:
            for user_id in [*range(1, USERS + 1), PROBE_AUTHOR, PROBE_FOLLOWER]:
                add_user(conn, user_id)
        ensure_topics(self.s.kafka("chaos"), command_topics(self.s))
        self.start_supervisor()
        wait_until(
            lambda: httpx.get(f"{self.api}/health", timeout=5).status_code < 500,
            300,
            "the HTTP API",
        )
        with httpx.Client(base_url=self.api, timeout=60) as client:
            follow = {"follower_id": PROBE_FOLLOWER, "followee_id": PROBE_AUTHOR}
            while post_command(client, "probe-follow", "FollowUser", follow, say) is None:
                pass
        self.views = configured_views(views_config(self.s))
        self.results = Results(self.s)
        self.results.start()
        took = self.probe(time.monotonic())
        if took is None:
            raise TributaryError("the parts never became ready (the first probe is not visible)")
        say(f"all parts ready; first probe visible after {took:.1f}s")
        self.workload = Workload(self.s, self.api, self.results)
        self.workload.start()

    def start_supervisor(self) -> None:
        self.supervisor_log = self.logs / f"run-{self.generation}.out"
        self.generation += 1
        with open(self.supervisor_log, "wb") as out:
            self.supervisor = subprocess.Popen(
                [sys.executable, "-m", "infra.cli", "run"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(lambda: set(self.children()) == set(SUPERVISED), 60, "the supervisor's parts")

    def children(self) -> dict[str, int]:
        """The latest PID the running supervisor announced for each part."""
        try:
            text = self.supervisor_log.read_text()
        except OSError:
            return {}
        return {name: int(pid) for name, pid in STARTED.findall(text)}

    def teardown(self, failed: bool) -> None:
        # A second Ctrl-C must not leave the stack running: tear-down finishes first.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if self.workload is not None:
            self.workload.halt.set()
            self.workload.running.set()
        if self.results is not None:
            self.results.halt.set()
        if self.supervisor is not None and self.supervisor.poll() is None:
            self.supervisor.send_signal(signal.SIGTERM)
            try:
                self.supervisor.wait(240)
            except subprocess.TimeoutExpired:
                self.supervisor.kill()
                self.supervisor.wait()
        for pid in self.children().values():
            if is_alive(pid):
                self.defects.append(f"part pid {pid} outlived its stopped supervisor")
                os.kill(pid, signal.SIGKILL)
        self.stack.down()
        root = self.s.home.parent
        if failed or self.keep:
            kept = Path(tempfile.mkdtemp(prefix="tributary-chaos-logs-"))
            shutil.copytree(self.s.home / "logs", kept / "stack-logs", dirs_exist_ok=True)
            shutil.copytree(self.logs, kept / "harness", dirs_exist_ok=True)
            say(f"logs kept in {kept}")
        if self.keep:
            say(f"state kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    # -- killing and restarting ----------------------------------------------------------

    def kill(self, part: str, row: Row) -> None:
        """kill -9 of ``part``, then what brings it back that is not the supervisor's job."""
        if part == "supervisor":
            self.kill_supervisor()
        elif part in SUPERVISED:
            pid = self.children()[part]
            if not is_alive(pid):
                raise TributaryError(f"{part}: announced pid {pid} is not running")
            below = descendants(pid)  # e.g. the Spark driver's JVM
            os.kill(pid, signal.SIGKILL)
            self.expect_gone(f"kill -9 of {part}", below)
        elif part == LOSS:
            self.kill_service("broker", row)
        else:
            self.kill_service(part)

    def kill_supervisor(self) -> None:
        assert self.supervisor is not None
        below = descendants(self.supervisor.pid)
        self.supervisor.send_signal(signal.SIGKILL)
        self.supervisor.wait()
        self.expect_gone("kill -9 of the supervisor", below)
        self.start_supervisor()

    def expect_gone(self, what: str, pids: list[int], timeout: float = 180.0) -> None:
        """Every process below a killed one must end with it (no orphan keeps running)."""
        try:
            wait_until(lambda: not any(is_alive(p) for p in pids), timeout, "the children")
        except TimeoutError:
            alive = [p for p in pids if is_alive(p)]
            self.defects.append(f"{what}: pids {alive} still running after {timeout:.0f}s")
            for pid in alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def kill_service(self, name: str, lossy: Row | None = None) -> None:
        """kill -9 of a stack service; with ``lossy``, the broker also loses its last batches."""
        service = self.stack.service(name)
        pid = service.pid()
        if pid is None:
            raise TributaryError(f"{name}: no running pid in {service.pidfile.path}")
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not is_alive(pid), 60, f"{name} to die", every=0.05)
        if lossy is not None:
            lost = self.tail.lose(killed - LOSS_WINDOW_S)
            for batch in lost:
                kind = "events" if batch.topic.startswith(self.s.event_topic_prefix) else "changes"
                lossy.dropped[kind] = lossy.dropped.get(kind, 0) + batch.records
            say(
                f"{name}: lost {sum(b.records for b in lost)} acknowledged records of the last"
                f" {LOSS_WINDOW_S:.0f}s: "
                + ", ".join(f"{b.topic}[{b.partition}]@{b.offset}+{b.records}" for b in lost)
            )

        def up() -> bool:  # as `tributary up`: start whatever is not running
            try:
                self.stack.up()
            except TributaryError as exc:
                say(f"up: {str(exc).splitlines()[0]} (again)")
                time.sleep(2)
                return False
            return True

        wait_until(up, 300, f"{name} to start again", every=0.1)

    # -- probes --------------------------------------------------------------------------

    def probe(self, killed_at: float) -> float | None:
        """Seconds from ``killed_at`` until a write made now is visible in every view."""
        assert self.results is not None
        token = f"probe {uuid.uuid4()}"
        self.probe_post += 2
        by_topic, by_http = self.probe_post, self.probe_post + 1
        text = f"probe #probe {token}"
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S

        def sql() -> None:
            while time.monotonic() < deadline:
                try:
                    with psycopg.connect(
                        self.s.postgres().dsn, autocommit=True, connect_timeout=5
                    ) as c:
                        c.execute(
                            "UPDATE public.users SET bio = %s WHERE id = %s", (token, PROBE_AUTHOR)
                        )
                    return
                except psycopg.Error:
                    time.sleep(0.5)

        def http() -> None:
            data = {"post_id": by_http, "author_id": PROBE_AUTHOR, "text": text}
            with httpx.Client(base_url=self.api, timeout=60) as client:
                while time.monotonic() < deadline:
                    if post_command(client, f"probe-{by_http}", "CreatePost", data, lambda _: None):
                        return

        def topic() -> None:
            assert self.results is not None
            client = CommandClient(self.s.kafka("chaos-probe"), command_topics(self.s))
            data = {"post_id": by_topic, "author_id": PROBE_AUTHOR, "text": text}
            while time.monotonic() < deadline:
                try:
                    client.send(
                        "CreatePost", data, command_id=f"probe-{by_topic}", key=f"post-{by_topic}"
                    )
                except Exception:
                    time.sleep(1)
                    continue
                if self.results.wait(f"probe-{by_topic}", 20) is not None:
                    return

        writers = [threading.Thread(target=f, daemon=True) for f in (sql, http, topic)]
        for w in writers:
            w.start()
        for w in writers:
            w.join(max(0.0, deadline - time.monotonic()))

        def visible() -> bool:
            return self.visible(token, (by_topic, by_http))

        try:
            wait_until(visible, max(0.0, deadline - time.monotonic()), "the probe", every=0.5)
        except TimeoutError:
            return None
        return time.monotonic() - killed_at

    def visible(self, token: str, posts: tuple[int, ...]) -> bool:
        search, profile = self.views["search"].store, self.views["profile"].store
        if any(search.get("posts", str(p)) is None for p in posts):
            return False
        entry = profile.get("profiles", str(PROBE_AUTHOR))
        if entry is None or entry.fields.get("bio") != token:
            return False
        with psycopg.connect(self.s.postgres().dsn, connect_timeout=5) as conn:
            bio = conn.execute(
                f"SELECT bio FROM {self.s.views_schema}.public_users WHERE id = %s",
                (PROBE_AUTHOR,),
            ).fetchone()
            listed = conn.execute(
                f"SELECT count(*) FROM {self.s.views_schema}.timeline"
                " WHERE user_id = %s AND post_id = ANY(%s)",
                (PROBE_FOLLOWER, list(posts)),
            ).fetchone()
        return (
            bio is not None and bio[0] == token and listed is not None and listed[0] == len(posts)
        )

    # -- checking ------------------------------------------------------------------------

    def repair(self) -> str:
        """`tributary repair` as a user runs it, until the topics match the source of truth."""
        did: list[str] = []
        for attempt in range(1, 6):
            done = subprocess.run(
                [sys.executable, "-m", "infra.cli", "repair", "--json"],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            say(
                f"repair #{attempt}: exit {done.returncode} {done.stdout.strip()[:300]}"
                f" {done.stderr.strip()[-300:]}"
            )
            did.append(repaired(done.stdout))
            try:
                wait_until(
                    lambda: verify(self.s, views=False).ok,
                    120,
                    "the topics to be repaired",
                    every=5,
                )
                break
            except TimeoutError:
                continue
        return "; ".join(did)

    def named(self) -> str:
        """What `verify` names against the topics, before any repair (the lossy parts)."""
        report = verify(self.s, views=False)
        missing = report.events.missing if report.events is not None else []
        rows = [(t.table, key) for t in report.tables for key in [*t.missing, *t.stale]]
        say(
            f"verify before repair: ok={report.ok}; {len(missing)} events missing"
            f" {missing[:8]}; {len(rows)} rows missing or stale {rows[:8]}; errors {report.errors}"
        )
        return f"{len(missing)} events, {len(rows)} rows"

    def check(self, part: str, row: Row) -> None:
        assert self.workload is not None and self.results is not None
        say(f"{part}: pausing the workload for the check")
        self.workload.pause()
        results = self.results
        workload = self.workload

        def compare() -> Diffs:
            return compare_all(
                self.s, self.views, list(workload.answers.values()), results.snapshot()
            )

        if part in LOSSY:
            time.sleep(10)  # what CDC still had to publish is published (verify names losses)
            row.named = self.named()
            try:
                short = new_since(self.last, compare())
                row.short = totals(short)[0]
                say(f"{part}: before repair the views lack {row.short}: {sorted(short)[:12]}")
            except Exception as exc:
                say(f"{part}: cannot compare before repair: {type(exc).__name__}: {exc}")
            row.repaired = self.repair()

        diffs: Diffs = {}
        started = said = time.monotonic()
        while True:
            try:
                diffs = compare()
            except Exception as exc:
                diffs = {f"compare failed: {type(exc).__name__}: {str(exc)[:120]}": (1, 0)}
            if not diffs or time.monotonic() - started > CONVERGE_TIMEOUT_S:
                break
            if time.monotonic() - said > 60:  # say what is still behind, once a minute
                said = time.monotonic()
                say(f"{part}: after {said - started:.0f}s still {len(diffs)}: {sorted(diffs)[:8]}")
            time.sleep(5)
        row.converged_s = time.monotonic() - started
        new = new_since(self.last, diffs)
        self.last = diffs
        row.lost, row.twice = totals(new)
        row.examples = sorted(new)[:12]
        say(
            f"{part}: converged in {time.monotonic() - started:.0f}s"
            if not diffs
            else f"{part}: {len(diffs)} differences after {CONVERGE_TIMEOUT_S:.0f}s:"
            f" {sorted(diffs)[:12]}"
        )
        self.workload.resume()

    def load(self, row: Row) -> None:
        """Item 5 with the views running: ``LOAD_SENDERS`` senders (half through the topic, half
        through HTTP) send without pause for ``load_s``; then every view must equal the
        reference. Time to recover is the time from the end of the load until they do."""
        assert self.workload is not None
        answered = len(self.workload.answers)
        before = (self.workload.topic_senders, self.workload.http_senders, self.workload.pace_s)
        self.workload.scale(LOAD_SENDERS // 2, LOAD_SENDERS // 2, 0.0)
        time.sleep(self.load_s)
        self.check(LOAD, row)  # pauses the workload: every command in flight gets its answer
        done = list(self.workload.answers.values())[answered:]
        statuses = Counter(str((a.result or {}).get("status", "no answer")) for a in done)
        row.trials, row.recoveries = 1, [row.converged_s]
        say(
            f"load: {len(done)} commands answered in {self.load_s:.0f}s by {LOAD_SENDERS}"
            f" senders ({len(done) / self.load_s:.1f}/s) {dict(statuses)}; the views equal the"
            f" reference {row.converged_s:.0f}s after the senders stopped"
        )
        self.workload.scale(*before)

    # -- the run -------------------------------------------------------------------------

    def run(self) -> list[Row]:
        rows = []
        for part in self.parts:
            row = Row(part)
            if part == LOAD:
                self.load(row)
                rows.append(row)
                print_table(rows)
                continue
            for trial in range(1, self.trials + 1):
                time.sleep(self.rng.uniform(3, 8))  # mid-workload
                killed_at = time.monotonic()
                self.kill(part, row)
                took = self.probe(killed_at)
                row.trials += 1
                if took is None:
                    row.unrecovered += 1
                    say(f"{part} #{trial}: NOT recovered within {RECOVERY_TIMEOUT_S:.0f}s")
                else:
                    row.recoveries.append(took)
                    say(f"{part} #{trial}: recovered in {took:.1f}s")
            self.check(part, row)
            rows.append(row)
            print_table(rows)
        return rows


def print_table(rows: list[Row]) -> None:
    table = Table(
        "part",
        "trials",
        "records lost",
        "records applied twice",
        "recover median (s)",
        "max (s)",
        "not recovered",
        "dropped by the broker",
        "verify named (before repair)",
        "views lacked (before repair)",
        "repair",
        title="chaos: kill -9 under load",
    )
    for r in rows:
        table.add_row(
            r.part,
            str(r.trials),
            str(r.lost),
            str(r.twice),
            f"{statistics.median(r.recoveries):.1f}" if r.recoveries else "-",
            f"{max(r.recoveries):.1f}" if r.recoveries else "-",
            str(r.unrecovered),
            dropped(r) if r.part == LOSS else "-",
            r.named,
            "-" if r.short is None else str(r.short),
            r.repaired,
        )
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--trials", type=int, default=20, help="kills per part (default 20)")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated, any of {','.join(PARTS)}"
    )
    parser.add_argument("--keep", action="store_true", help="keep the state folder and logs")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument(
        "--load-seconds", type=float, default=120.0, help="how long the load part sends"
    )
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {unknown}; choose from {','.join(PARTS)}")
    harness = Harness(args.trials, parts, args.keep, args.seed, args.load_seconds)
    rows: list[Row] = []
    failed = True
    try:
        harness.setup()
        rows = harness.run()
        failed = any(r.failed for r in rows) or bool(harness.defects)
    finally:
        harness.teardown(failed)
    for row in rows:
        for example in row.examples:
            console.print(f"  {row.part}: {example}", markup=False)
    for defect in harness.defects:
        console.print(f"defect: {defect}", markup=False)
    if harness.workload is not None:
        sent = len(harness.workload.answers)
        console.print(
            f"workload: {sent} commands answered,"
            f" {len(harness.workload.errors)} transient client errors"
        )
    print_table(rows)
    return 1 if failed else 0


def repaired(stdout: str) -> str:
    """One line of what `tributary repair --json` did."""
    try:
        done = json.loads(stdout)
    except ValueError:
        return "no JSON answer"
    tables = "".join(
        f"; {t}: {d.get('snapshot_keys', 0)} keys re-snapshot"
        for t, d in done.get("tables", {}).items()
    )
    return f"{done.get('events_republished', 0)} events republished{tables}"


def dropped(row: Row) -> str:
    return f"{row.dropped.get('events', 0)} events, {row.dropped.get('changes', 0)} row changes"
