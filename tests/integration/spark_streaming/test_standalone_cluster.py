"""The mirror on a real Spark standalone cluster: a master and two workers started from the
pyspark wheel on loopback, the driver pointed at ``spark://…``, the same result as local[2]."""

import contextlib
import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest

from infra.errors import WaitTimeoutError
from infra.polling import poll_until
from infra.stack.isolated import free_port_block
from spark_streaming.views import ViewsConfig
from tests.integration.spark_streaming.changefeed import ChangeFeed, applied_counts, mirror_rows
from tests.integration.spark_streaming.test_crash_recovery import driver, view_table

SPARK_HOME = Path(pyspark.__file__).parent


class Cluster:
    """A standalone master and its workers, each in its own process group."""

    def __init__(self, work: Path) -> None:
        base = free_port_block(6)
        self.port, self.ui_port = base, base + 1
        self.work = work
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(work / "logs"),
            "SPARK_WORKER_DIR": str(work / "workers"),
            "SPARK_NO_DAEMONIZE": "1",
        }
        self._next_port = base + 2

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, *args: str) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        with open(self.work / f"{name}.log", "wb") as out:
            self.procs.append(
                subprocess.Popen(
                    [str(SPARK_HOME / "bin" / "spark-class"), *args],
                    env=self.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def start(self, workers: int = 2) -> None:
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port),
        )  # fmt: skip
        self._wait(lambda state: True, "the master")
        for i in range(workers):
            ui = self._next_port
            self._next_port += 1
            self._spawn(
                f"worker-{i}",
                "org.apache.spark.deploy.worker.Worker", self.url,
                "--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", str(ui),
            )  # fmt: skip
        self._wait(
            lambda state: sum(w["state"] == "ALIVE" for w in state["workers"]) == workers,
            f"{workers} workers",
        )

    def _wait(self, ready: Any, what: str, timeout: float = 120) -> None:
        def state() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                return bool(ready(json.load(r)))

        try:
            poll_until(state, timeout, f"Spark {what}", retry_on=(OSError,))
        except WaitTimeoutError as exc:
            logs = "\n".join(p.read_text()[-800:] for p in self.work.glob("*.log"))
            raise AssertionError(f"Spark {what} did not come up:\n{logs}") from exc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path / "spark-cluster")
    try:
        running.start()
        yield running
    finally:
        running.stop()


def test_the_mirror_runs_on_a_standalone_cluster_to_the_same_result(
    cluster: Cluster, feed: ChangeFeed, views_config: ViewsConfig, tmp_path: Path
) -> None:
    feed.run(1500)
    executors = tmp_path / "executors"
    proc = driver(views_config, feed, master=cluster.url, executors_file=str(executors))
    assert proc.wait(600) == 0
    # The driver plus one executor per worker took part.
    assert int(executors.read_text()) == 3
    table = view_table(views_config, feed)
    source = feed.rows()
    assert mirror_rows(feed.dsn, table) == source
    assert applied_counts(feed.dsn, table) == {k: v[3] for k, v in source.items()}
