"""``kill -9`` of the Spark driver inside a batch and right after the sink's commit, then a
restart: the mirror equals the source and no change was applied twice."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from spark_streaming.view_job import BatchReport, ViewJob
from tests.integration.spark_streaming.changefeed import ChangeFeed, applied_counts, mirror_rows
from views.catalog import ViewsConfig, configured_views

ROOT = Path(__file__).resolve().parents[3]
MAX_OFFSETS = 400  # several batches per run


def driver(config: ViewsConfig, feed: ChangeFeed, **pause: object) -> subprocess.Popen[bytes]:
    cfg = {
        "bootstrap_servers": config.kafka.bootstrap_servers,
        "kafka_extra": config.kafka.extra,  # a brought Kafka's security
        "dsn": config.postgres_dsn,
        "views_schema": config.views_schema,
        "checkpoint_root": str(config.checkpoint_root),
        "table": feed.qualified,
        "max_offsets_per_trigger": MAX_OFFSETS,
        **pause,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.spark_streaming.mirror_driver", json.dumps(cfg)],
        cwd=ROOT,
        start_new_session=True,  # its own process group: the JVM and workers go with it
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver (and its JVM / Python workers, all in the group we created)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def wait_marker(proc: subprocess.Popen[bytes], marker: Path, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"driver exited with {proc.returncode} before the crash point")
        if time.monotonic() > deadline:
            kill_group(proc)
            raise AssertionError("driver never reached the crash point")
        time.sleep(0.2)
    return marker.read_text()


def run_to_end(spark: Any, config: ViewsConfig) -> list[dict[str, Any]]:
    """Run the mirror until it has read everything (a new query in the tests' Spark session,
    reading the checkpoint and the store as a restarted driver would); its batch reports."""
    [view] = configured_views(config).values()
    reports: list[dict[str, Any]] = []

    def report(batch: BatchReport) -> None:
        reports.append(
            {"batch_id": batch.batch_id, "applied": batch.applied, "records": batch.records}
        )

    options = config.job_options(max_offsets_per_trigger=MAX_OFFSETS)
    job = ViewJob(spark, view, config.kafka, options, on_batch=report)
    try:
        query = job.start(available_now=True)
        assert query.awaitTermination(300), "the mirror did not read everything in 300 s"
        assert query.exception() is None, query.exception()
    finally:
        job.close()
    return reports


def view_table(config: ViewsConfig, feed: ChangeFeed) -> str:
    return f"{config.views_schema}.{feed.schema}_{feed.table}"


@pytest.mark.parametrize("point", ["before_commit", "after_commit"])
def test_kill_9_then_restart_applies_everything_exactly_once(
    spark: Any, feed: ChangeFeed, views_config: ViewsConfig, tmp_path: Path, point: str
) -> None:
    feed.run(1500)  # about 1,700 records: 5 batches of 400
    marker = tmp_path / "paused"
    proc = driver(views_config, feed, pause_at=point, pause_batch=2, marker=str(marker))
    assert wait_marker(proc, marker) == f"{point} 2"
    kill_group(proc)  # kill -9 while batch 2 is mid-transaction / just committed
    table = view_table(views_config, feed)
    partial = mirror_rows(feed.dsn, table)
    assert partial != feed.rows()  # the crash really left the view behind

    batches = run_to_end(spark, views_config)  # the restart reads the checkpoint's offset log
    # Spark re-ran batch 2 from its offset log; the ledger applied it only if it had not committed.
    assert (batches[0]["batch_id"], batches[0]["applied"]) == (2, point == "before_commit")
    assert all(b["applied"] for b in batches[1:]) and len(batches) > 2
    source = feed.rows()
    assert mirror_rows(feed.dsn, table) == source
    assert applied_counts(feed.dsn, table) == {k: v[3] for k, v in source.items()}
