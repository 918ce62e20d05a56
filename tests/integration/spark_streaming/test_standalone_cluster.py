"""The mirror on a real Spark standalone cluster started as the local stack starts it
(`tributary up --spark-workers 2`: a master and two workers from the pyspark wheel, on
loopback): `status` shows them, the views' master (`auto`) points at it, and the mirror comes
out the same as on local[2]."""

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.settings import Settings
from infra.stack import LocalStack
from infra.stack.isolated import isolated_settings, settings_env
from infra.stack.spark import LOCAL_MASTER, resolve_master
from spark_streaming.views import ViewsConfig
from tests.integration.spark_streaming.changefeed import ChangeFeed, applied_counts, mirror_rows
from tests.integration.spark_streaming.test_crash_recovery import driver, view_table

ROOT = Path(__file__).resolve().parents[3]


def auto_master(settings: Settings) -> str:
    return resolve_master(
        "auto", settings.home, settings.spark_master_port, settings.spark_master_ui_port
    )


@pytest.fixture
def cluster() -> Iterator[tuple[Settings, LocalStack]]:
    settings = isolated_settings("tributary-spark-")
    stack = LocalStack(settings, spark_workers=2)
    try:
        stack.up([svc.name for svc in stack.spark])  # the cluster alone: the test has its stack
        yield settings, stack
    finally:
        for svc in reversed(stack.spark):
            svc.stop()
        shutil.rmtree(settings.home.parent, ignore_errors=True)


def test_the_mirror_runs_on_the_stacks_standalone_cluster_to_the_same_result(
    cluster: tuple[Settings, LocalStack],
    feed: ChangeFeed,
    views_config: ViewsConfig,
    tmp_path: Path,
) -> None:
    settings, stack = cluster
    status = subprocess.run(
        [sys.executable, "-m", "infra.cli", "status", "--json"],
        cwd=ROOT,
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    rows = {row["name"]: row for row in json.loads(status.stdout)}
    master = stack.spark_master.endpoint()
    assert rows["spark-master"]["state"] == "up" and rows["spark-master"]["endpoint"] == master
    assert {rows[f"spark-worker-{i}"]["state"] for i in range(2)} == {"up"}
    assert auto_master(settings) == master  # every view and analytics job runs on it

    feed.run(1500)
    executors = tmp_path / "executors"
    proc = driver(views_config, feed, master=master, executors_file=str(executors))
    assert proc.wait(600) == 0
    # The driver plus one executor per worker took part.
    assert int(executors.read_text()) == 3
    table = view_table(views_config, feed)
    source = feed.rows()
    assert mirror_rows(feed.dsn, table) == source
    assert applied_counts(feed.dsn, table) == {k: v[3] for k, v in source.items()}

    stack.spark_workers[1].stop()
    stack.spark_master.stop()
    assert auto_master(settings) == LOCAL_MASTER  # no cluster: Spark in the jobs' process
