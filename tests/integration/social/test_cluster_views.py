"""The social views on the local stack's Spark cluster (`tributary up --spark-workers 2`: a
master and two workers from the pyspark wheel, on loopback): `status` shows them, `tributary
run views` with the default master (`auto`) runs its jobs on an executor of each worker; one
worker is killed with kill -9 mid-workload (its executor goes with it) and the views still end
equal to the source of truth. A stateful analytics job runs beside them on the cluster (sessions,
`transformWithStateInPandas`; its state store in the checkpoint both workers reach), fed while
the worker dies, and ends equal to the reference. The executors' Python (named with
`TRIBUTARY_SPARK_CONF`) has every dependency but cannot import Tributary (no `site`: not the
editable install, nor the work tree on `PYTHONPATH`): they import it from the zip the driver
ships (spark_streaming/shipping.py). Without the cluster, `auto` is Spark in the jobs' own
process."""

import json
import os
import shlex
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from examples.social.activity import ActivityProducer
from infra.polling import Deadline, poll_until
from infra.settings import Settings, load_settings
from infra.stack import LocalStack
from infra.stack.isolated import free_port_block
from infra.stack.spark import LOCAL_MASTER, resolve_master
from infra.views import views_config
from tests.integration.analytics import reference
from tests.integration.analytics.feed import make_workload
from tests.integration.analytics.lab import LATENESS, session_rows
from tests.integration.conftest import Endpoints
from tests.integration.pipeline.views_process import ViewsProcess
from tests.integration.social.world import Workload, World, views_equal_the_truth
from views.catalog import configured_views

TEST_TIMEOUT_S = 420
ROOT = Path(__file__).resolve().parents[3]


def ports(settings: Settings) -> dict[str, str]:
    return {
        "TRIBUTARY_SPARK_MASTER_PORT": str(settings.spark_master_port),
        "TRIBUTARY_SPARK_MASTER_UI_PORT": str(settings.spark_master_ui_port),
    }


def auto_master(settings: Settings) -> str:
    return resolve_master(
        "auto", settings.home, settings.spark_master_port, settings.spark_master_ui_port
    )


def python_without_tributary(folder: Path) -> Path:
    """This venv's Python without ``site`` (no .pth file: not the editable install's finder)
    and with only its site-packages on the path (not the work tree PYTHONPATH names here): every
    dependency, and Tributary only from what Spark puts on its path."""
    packages = dict.fromkeys((sysconfig.get_path("purelib"), sysconfig.get_path("platlib")))
    script = folder / "executor-python"
    script.write_text(
        "#!/bin/sh\n"
        f"PYTHONPATH={shlex.quote(':'.join(packages))}\n"
        "export PYTHONPATH\n"
        f'exec {shlex.quote(sys.executable)} -S "$@"\n'
    )
    script.chmod(0o755)
    hidden = subprocess.run(
        [script, "-c", "import projections"], cwd=folder, capture_output=True, text=True
    )
    assert hidden.returncode != 0 and "No module named 'projections'" in hidden.stderr
    deps = "import pyspark, pandas, pyarrow, confluent_kafka, fastavro, psycopg, pydantic"
    found = subprocess.run([script, "-c", deps], cwd=folder, capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    return script


@pytest.fixture
def cluster(world: World) -> Iterator[tuple[Settings, LocalStack]]:
    """The stack's cluster in the world's state folder, where `auto` looks for it."""
    base = free_port_block(16)
    settings = load_settings(
        home=world.settings.home, spark_master_port=base, spark_master_ui_port=base + 1
    )
    stack = LocalStack(settings, spark_workers=2)
    try:
        stack.up([svc.name for svc in stack.spark])  # the cluster alone: the test has its stack
        yield settings, stack
    finally:
        for svc in reversed(stack.spark):
            svc.stop()


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_the_views_run_on_the_stacks_cluster_and_survive_a_worker_killed_mid_batch(
    world: World,
    stack: Endpoints,
    cluster: tuple[Settings, LocalStack],
    unique: str,
    tmp_path: Path,
) -> None:
    budget = Deadline(TEST_TIMEOUT_S - 30)
    spark, local = cluster
    status = subprocess.run(
        [sys.executable, "-m", "infra.cli", "status", "--json"],
        cwd=ROOT,
        env={**os.environ, **{f"TRIBUTARY_{k}": v for k, v in world.env.items()}, **ports(spark)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    rows = {row["name"]: row for row in json.loads(status.stdout)}
    master = local.spark_master.endpoint()
    assert rows["spark-master"]["state"] == "up" and rows["spark-master"]["endpoint"] == master
    assert {rows[f"spark-worker-{i}"]["state"] for i in range(2)} == {"up"}
    assert auto_master(spark) == master  # every view and analytics job runs on it
    views = {v.name: v for v in configured_views(views_config(world.settings)).values()}
    analytics = {  # one stateful analytics job, on topics of this test's own
        "ANALYTICS": "examples.social.analytics:sessions_only",
        "ACTIVITY_TOPIC": f"act_{unique}",
        "ANALYTICS_TOPIC_PREFIX": f"an_{unique}.",
    }
    sessions = configured_views(
        replace(
            views_config(world.settings),
            analytics_factories=(analytics["ANALYTICS"],),
            activity_topic=analytics["ACTIVITY_TOPIC"],
            analytics_topic_prefix=analytics["ANALYTICS_TOPIC_PREFIX"],
        )
    )["sessions"]
    assert world.settings.allowed_lateness_s * 1000 == LATENESS.allowed_ms
    work = make_workload(LATENESS)  # activity: device clocks skewed, late events, stragglers
    activity = work.activity
    feed = ActivityProducer(stack.kafka, analytics["ACTIVITY_TOPIC"])
    world.cdc.start()
    world.cdc.wait_running()
    # the executors' Python: Tributary only from the zip the driver ships
    executors = {"spark.pyspark.python": str(python_without_tributary(tmp_path))}
    on_cluster = ViewsProcess(  # the default master, `auto`: the stack's cluster
        stack,
        world.views.home,
        **world.env,
        **analytics,
        SPARK_CONF=json.dumps(executors),
        **{k.removeprefix("TRIBUTARY_"): v for k, v in ports(spark).items()},
    )
    on_cluster.start()
    workload = Workload(world.settings)
    errors: list[BaseException] = []
    half = len(activity) // 2  # in its order: one half before the kill, one after

    def run() -> None:
        try:
            for _ in range(900):
                workload.step()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    def sessions_batches() -> int:
        return sessions.store.committed(sessions.store.live_generation()).batches

    writer = threading.Thread(target=run)
    try:
        feed.send(activity[:half])
        feed.flush()
        writer.start()

        def batches_on_the_cluster() -> bool:
            assert on_cluster.alive(), on_cluster.output()
            timeline = views["timeline"].store
            return timeline.committed(timeline.live_generation()).batches > 2

        poll_until(batches_on_the_cluster, budget.left(240), "batches on the cluster", 0.5)
        poll_until(lambda: sessions_batches() > 0, budget.left(120), "a sessions batch", 0.5)
        # the views' driver holds an executor (one core) on each worker
        assert local.spark_master.running_applications() == [2], on_cluster.output()
        worker = local.spark_workers[1].pid()
        assert worker is not None
        os.kill(worker, signal.SIGKILL)  # mid-workload: batches keep coming
        sessions_at_kill = sessions_batches()
        for start in range(half, len(activity), 32):  # its state must cross to the worker left
            feed.send(activity[start : start + 32])
            feed.flush()
            time.sleep(0.5)
        writer.join(budget.left(240))
        assert not writer.is_alive() and not errors, errors
        poll_until(  # the master saw it go (its connection dropped)
            lambda: local.spark_master.alive_workers() == {local.spark_workers[0].port},
            budget.left(120),
            "the master to count one worker",
            0.5,
        )

        def converged() -> bool:
            assert on_cluster.alive(), on_cluster.output()
            return views_equal_the_truth(views, world.dsn)

        poll_until(converged, budget.left(240), "the views to equal the source of truth", 1)
        truth = reference.sessions(work)

        def sessions_converged() -> bool:
            assert on_cluster.alive(), on_cluster.output()
            return session_rows(sessions) == truth

        poll_until(sessions_converged, budget.left(120), "the sessions to equal the reference", 1)
        assert sessions_batches() > sessions_at_kill  # batches after the kill, on its state
    finally:
        if writer.is_alive():
            writer.join(60)
        on_cluster.stop()
    local.spark_master.stop()
    assert auto_master(spark) == LOCAL_MASTER  # no cluster: Spark in the jobs' own process
