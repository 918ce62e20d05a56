"""Take-over after ``kill -9`` under load: `tributary run cdc commands views` (the supervisor,
with its warm views standby), commands through the ``commands`` topic and users by SQL the
whole time; the command processor is killed, then the views process that holds the views'
leases. The replacements answer commands and bring every view current within seconds, and at
the end every view equals the source of truth and every command has exactly one result. Then
the HTTP API on the live views: a command, and reads that wait for its position token.

The killed views process dies mid-batch (the load never stops), so its replacement also proves
that each store resumes from what it holds: nothing lost, nothing applied twice.

Then, on the same running world, a user is forgotten end to end (issue 23): the scenario of
tests/integration/social/forget_scenario.py, whose docstring says what it shows.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from connectors.kafka import KafkaConfig
from event_store.command_topic import CommandClient, ensure_topics
from examples.social.views.reference import expected_profiles
from infra.command_results import Results
from infra.commands import command_topics, load_registry
from infra.http_api import create_app
from infra.polling import Deadline, poll_until
from infra.views import views_config
from tests.integration.conftest import Endpoints
from tests.integration.social.forget_scenario import (
    SCENARIO_S,
    a_forgotten_user_is_gone_from_every_view_and_every_replay,
)
from tests.integration.social.world import (
    Workload,
    World,
    source_of_truth,
    views_equal_the_truth,
)
from views.catalog import configured_views

ROOT = Path(__file__).resolve().parents[3]
TAKEOVER_S = 440  # the take-over's waits draw on one budget of this many seconds
TEST_TIMEOUT_S = TAKEOVER_S + SCENARIO_S + 60
#: The aims (issue 20): commands answered again within 5 s, every view current within 15 s.
#: The test allows twice that, so a loaded machine does not fail it; it prints what it measured.
COMMANDS_TAKEOVER_S, VIEWS_TAKEOVER_S = 10.0, 30.0
PROBE_AUTHOR, PROBE_FOLLOWER = 9001, 9002


class Run:
    """`tributary run cdc commands views` in its own process group."""

    def __init__(self, world: World, extra: dict[str, str]) -> None:
        self.log = world.settings.home / "run.out"
        self.logs = world.settings.home / "logs"  # each part's own log
        self.env = {
            **os.environ,
            **{f"TRIBUTARY_{k}": v for k, v in world.env.items()},
            **extra,
            "COLUMNS": "200",
        }
        world.settings.home.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "infra.cli", "run", "cdc", "commands", "views"],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def pids(self, part: str) -> list[int]:
        """Every pid the supervisor announced for a part, oldest first."""
        return [
            int(p) for p in re.findall(rf"{re.escape(part)}: started \(pid (\d+)\)", self.output())
        ]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        # A part that outlived the supervisor's grace on SIGTERM (the stop took 90 s in 2 of 26
        # runs, 21 alone and 5 in CI; cause not found yet): named in the run's warnings with the
        # end of its log, so the next one that happens says which part and where it was.
        for part in re.findall(r"(\S+): stopped \(killed after", self.output()):
            log = self.logs / f"run-{part}.log"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
            warnings.warn(
                f"tributary run: {part} killed after the grace on SIGTERM:\n{tail}", stacklevel=2
            )


def lease_holder(dsn: str, lease: str) -> int | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pid FROM tributary.leases WHERE name = %s", (lease,)).fetchone()
    return None if row is None else int(row[0])


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_commands_and_views_take_over_within_seconds_of_a_kill_9_then_a_user_is_forgotten(
    world: World, stack: Endpoints, spark: Any, unique: str, tmp_path: Path
) -> None:
    budget = Deadline(TAKEOVER_S)
    settings = world.settings.model_copy(
        update={
            "commands_topic": f"commands_{unique}",
            "command_results_topic": f"command-results_{unique}",
            "command_processor_name": f"cp{unique}",
            "verify_interval_s": 0.0,
            "view_trigger_interval_s": 0.25,
        }
    )
    extra = {
        "TRIBUTARY_COMMANDS_TOPIC": settings.commands_topic,
        "TRIBUTARY_COMMAND_RESULTS_TOPIC": settings.command_results_topic,
        "TRIBUTARY_COMMAND_PROCESSOR_NAME": settings.command_processor_name,
        "TRIBUTARY_CDC_TABLES": "public.users,event_store.events",
        "TRIBUTARY_VERIFY_INTERVAL_S": "0",
        "TRIBUTARY_VIEW_TRIGGER_INTERVAL_S": "0.25",
        "TRIBUTARY_VIEWS_STANDBY": "true",  # the warm second views process under test
    }
    views = {v.name: v for v in configured_views(views_config(settings)).values()}
    run = Run(world, extra)
    kafka: KafkaConfig = settings.kafka("takeover-test")
    topics = command_topics(settings)
    registry, _ = load_registry(settings.command_handlers)
    client = CommandClient(kafka, topics, registry)
    results = Results(settings, "takeover-results", fetch_wait_ms=10)
    workload = Workload(settings)  # users by SQL (its command bus is not used)
    sent: set[str] = set()
    stop, errors = threading.Event(), []

    def send(command: str, data: dict[str, Any]) -> str:
        command_id = client.send(command, data)
        sent.add(command_id)
        return command_id

    def load() -> None:
        try:
            post = 1
            while not stop.is_set():
                roll = workload.rng.random()
                # the probe's users stay out of the load: the follower's timeline (the newest
                # 100 posts of its followees) must not be filled by load posts before the probe
                ids = sorted(set(workload.users) - {PROBE_AUTHOR, PROBE_FOLLOWER})
                if len(ids) < 8 or roll < 0.1:
                    user = workload.rng.randrange(1, 30)
                    workload.user(user, f"User {user}")
                elif roll < 0.6:
                    author = workload.rng.choice(ids)
                    send("CreatePost", {"post_id": post, "author_id": author, "text": f"p{post}"})
                    post += 1
                else:
                    a, b = workload.rng.sample(ids, 2)
                    send("FollowUser", {"follower_id": a, "followee_id": b})
                time.sleep(0.05)  # about 20 operations a second
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    def probe(label: str, since: float) -> tuple[float, float]:
        """Send a post by the probe author now; seconds from ``since`` until it is answered and
        until it is in the search index and the probe follower's timeline."""
        post_id = 10**6 + len(sent)
        command_id = send(
            "CreatePost", {"post_id": post_id, "author_id": PROBE_AUTHOR, "text": label}
        )
        answer = results.wait(command_id, budget.left(120))
        assert answer is not None and answer["status"] == "accepted", answer
        answered = time.monotonic() - since

        def visible() -> bool:
            assert run.alive(), run.output()[-3000:]
            if views["search"].store.get("posts", str(post_id)) is None:
                return False
            with psycopg.connect(world.dsn) as conn:
                try:
                    row = conn.execute(
                        "SELECT 1 FROM views.timeline WHERE user_id = %s AND post_id = %s",
                        (PROBE_FOLLOWER, post_id),
                    ).fetchone()
                except psycopg.errors.UndefinedTable:  # the view's first batch is not done yet
                    return False
            return row is not None

        poll_until(visible, budget.left(120), f"the {label} probe in the views", 0.05)
        return answered, time.monotonic() - since

    writer = threading.Thread(target=load)
    ensure_topics(kafka, topics)  # provisioned, as an operator does before clients send
    try:
        results.start()
        for user, name in ((PROBE_AUTHOR, "Author"), (PROBE_FOLLOWER, "Follower")):
            workload.user(user, name)
        writer.start()
        standby_log = world.settings.home / "logs" / "run-views-standby.log"

        def standing_by() -> bool:
            assert run.alive(), run.output()[-3000:]
            text = standby_log.read_text(errors="replace") if standby_log.exists() else ""
            return all(f"view {name}: standing by" in text for name in views)

        poll_until(standing_by, budget.left(240), "the views standby on every view", 0.5)
        send("FollowUser", {"follower_id": PROBE_FOLLOWER, "followee_id": PROBE_AUTHOR})
        probe("warm-up", time.monotonic())

        # 1. The command processor dies mid-load: its restart answers again.
        processor = run.pids("commands")[-1]
        killed = time.monotonic()
        os.kill(processor, signal.SIGKILL)
        commands_s, _ = probe("after-commands", killed)
        # 2. The views process holding the views' leases dies: the warm standby takes over.
        holder = lease_holder(world.dsn, "view:timeline")
        assert holder in run.pids("views"), run.output()[-3000:]  # the primary, not the standby
        killed = time.monotonic()
        os.kill(holder, signal.SIGKILL)
        _, views_s = probe("after-views", killed)
        taken = lease_holder(world.dsn, "view:timeline")
        assert taken is not None and taken != holder
        print(
            f"take-over after kill -9: commands answered again in {commands_s:.1f}s,"
            f" every view current in {views_s:.1f}s"
        )
        assert commands_s < COMMANDS_TAKEOVER_S, run.output()[-3000:]
        assert views_s < VIEWS_TAKEOVER_S, run.output()[-3000:]

        stop.set()
        writer.join(60)
        assert not errors, errors
        # 3. Nothing lost, nothing applied twice: one result per command, views = the truth.
        poll_until(
            lambda: sent <= set(results.snapshot()),
            budget.left(120),
            "a result for every command",
            0.5,
        )
        answers = results.snapshot()
        twice = {c: a for c, a in answers.items() if c in sent and len(a) != 1}
        assert not twice, f"commands answered more than once: {list(twice)[:5]}"

        def converged() -> bool:
            assert run.alive(), run.output()[-3000:]
            return views_equal_the_truth(views, world.dsn)

        poll_until(converged, budget.left(240), "the views to equal the source of truth", 1)
        http_reads_wait_for_the_commands_position(settings, list(views.values()), world.dsn, budget)

        # 4. Forgetting a user, on this world (its run goes on: CDC, commands, the views).
        a_forgotten_user_is_gone_from_every_view_and_every_replay(
            world, stack, spark, tmp_path, run.alive, run.stop
        )
    finally:
        stop.set()
        if writer.is_alive():
            writer.join(60)
        results.halt.set()
        run.stop()


def http_reads_wait_for_the_commands_position(
    settings: Any, views: list[Any], dsn: str, budget: Deadline
) -> None:
    """The HTTP API on the live views: a command, then reads that wait for it (min_position)."""
    app = create_app(settings, views=views)
    with TestClient(app) as client:
        truth = source_of_truth(dsn)
        author = PROBE_AUTHOR
        follower = PROBE_FOLLOWER  # follows the author since the warm-up
        done = client.post(
            "/commands",
            json={
                "type": "CreatePost",
                "data": {"post_id": 2 * 10**6, "author_id": author, "text": "zqxyz #http"},
            },
        )
        assert done.status_code == 200 and done.json()["status"] == "accepted", done.text
        token = done.json()["position_token"]
        hits = client.get(
            "/search", params={"q": "zqxyz", "min_position": token, "timeout": budget.left(60)}
        )
        assert hits.status_code == 200 and [h["post_id"] for h in hits.json()] == [2 * 10**6]
        assert hits.json()[0]["author_handle"] == truth.users[author]["handle"]
        profile = client.get(
            f"/profile/{author}", params={"min_position": token, "timeout": budget.left(60)}
        )
        assert profile.json()["posts"] == expected_profiles(truth)[author]["posts"] + 1
        timeline = client.get(
            f"/timeline/{follower}", params={"min_position": token, "timeout": budget.left(60)}
        )
        assert timeline.json()[0]["post_id"] == 2 * 10**6
        bad = client.post("/commands", json={"type": "CreatePost", "data": {"post_id": "x"}})
        assert bad.status_code == 422
        assert client.get("/health").status_code == 200
