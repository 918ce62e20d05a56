"""The views CLI end to end: `views --json`, `replay VIEW`, `run-views` until SIGTERM."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.conftest import Endpoints
from tests.integration.spark_streaming.changefeed import ChangeFeed, mirror_rows

ROOT = Path(__file__).resolve().parents[3]


def cli_env(stack: Endpoints, feed: ChangeFeed, views_schema: str, tmp: Path) -> dict[str, str]:
    return {
        **os.environ,
        "TRIBUTARY_HOME": str(tmp / "home"),
        "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        **stack.settings.kafka_security_env(),  # SASL/TLS of a brought Kafka
        "TRIBUTARY_SCHEMA_REGISTRY_URL": stack.settings.registry_url,
        "TRIBUTARY_POSTGRES_URL": stack.database_url,
        "TRIBUTARY_MIRROR_TABLES": feed.qualified,
        "TRIBUTARY_VIEWS": "",
        "TRIBUTARY_VIEWS_SCHEMA": views_schema,
        "TRIBUTARY_VIEW_CHECKPOINT_DIR": str(tmp / "checkpoints"),
        "TRIBUTARY_VIEW_TRIGGER_INTERVAL_S": "0.5",
    }


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infra.cli_views", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_views_replay_and_run_views_from_the_command_line(
    stack: Endpoints, feed: ChangeFeed, views_schema: str, tmp_path: Path
) -> None:
    env = cli_env(stack, feed, views_schema, tmp_path)
    view = f"mirror.{feed.qualified}"
    table = f"{views_schema}.{feed.schema}_{feed.table}"
    feed.run(600)
    [before] = json.loads(cli(env, "views", "--json").stdout)
    assert before["view"] == view and before["batch_id"] == -1 and before["lag"] == len(feed.sent)

    done = cli(env, "replay", view)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{view}: generation" in done.stdout and "is live" in done.stdout
    assert mirror_rows(feed.dsn, table) == feed.rows()
    [after] = json.loads(cli(env, "views", "--json").stdout)
    assert after["lag"] == 0 and after["generation"] != before["generation"]

    runner = subprocess.Popen(
        [sys.executable, "-m", "infra.cli_views", "run-views"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        feed.run(300)
        deadline = time.monotonic() + 180
        while mirror_rows(feed.dsn, table) != feed.rows():
            assert runner.poll() is None and time.monotonic() < deadline
            time.sleep(0.5)
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(90) == 0
        assert runner.stdout is not None and "views stopped" in runner.stdout.read()
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(30)
