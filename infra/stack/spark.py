"""A Spark standalone cluster in the local stack: a master and N workers, started from the
pyspark wheel's own launcher (``bin/spark-class``), on loopback, each a service with its pid
file and log like the others. `tributary up --spark-workers N` starts them; every view and
analytics job then runs on the cluster (``spark_master = "auto"``).

Everything a cluster needs is on this machine: the executors run this interpreter (its
dependencies; Tributary itself comes in the zip the driver ships, spark_streaming/shipping.py),
and the checkpoints are on the local disk every worker reads.
"""

import json
import os
from pathlib import Path
from typing import Any

from infra.stack.service import Service

LOCAL_MASTER = "local[2]"  # no cluster: Spark in the views' own process
_RECORD = "workers"  # under <home>/spark-master: how many workers `up` was asked for


def spark_home() -> Path:
    import pyspark  # imported here: `status` starts fast

    return Path(pyspark.__file__).parent


def _spark_env(home: Path, work: Path, java_options: str) -> dict[str, str]:
    env = {
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_NO_DAEMONIZE": "1",
    }
    if java_options:  # the master's and workers' JVMs (Spark's own variable for its daemons)
        env["SPARK_DAEMON_JAVA_OPTS"] = java_options
    return env


def _master_state(ui_port: int) -> dict[str, Any] | None:
    """The master's own account of the cluster (its web UI's JSON), or None."""
    import urllib.request  # imported here: `status` starts fast

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as answer:
            state: dict[str, Any] = json.load(answer)
            return state
    except (OSError, ValueError):  # URLError is an OSError
        return None


class SparkMasterService(Service):
    name = "spark-master"

    def __init__(self, home: Path, port: int, ui_port: int, java_options: str = "") -> None:
        super().__init__(home)
        self.port = port
        self.ui_port = ui_port
        self.java_options = java_options  # of the master's and the workers' JVMs

    def ports(self) -> dict[int, str]:
        return {
            self.port: "TRIBUTARY_SPARK_MASTER_PORT",
            self.ui_port: "TRIBUTARY_SPARK_MASTER_UI_PORT",
        }

    def endpoint(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def binaries(self) -> list[Path | str]:
        return [spark_home() / "bin" / "spark-class", "java"]

    def env(self) -> dict[str, str]:
        return _spark_env(spark_home(), self.data_dir, self.java_options)

    def argv(self) -> list[str]:
        return [
            str(spark_home() / "bin" / "spark-class"),
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--webui-port", str(self.ui_port),
        ]  # fmt: skip

    def ready(self) -> bool:
        state = _master_state(self.ui_port)
        return state is not None and state.get("status") == "ALIVE"

    def alive_workers(self) -> set[int]:
        """The RPC ports of the workers the master counts as alive."""
        state = _master_state(self.ui_port) or {}
        return {
            int(w["port"])
            for w in state.get("workers", [])
            if w.get("state") == "ALIVE" and w.get("host") == "127.0.0.1"
        }

    def running_applications(self) -> list[int]:
        """The cores each application (driver) the master runs now holds on its workers."""
        state = _master_state(self.ui_port) or {}
        return [int(app.get("cores", 0)) for app in state.get("activeapps", [])]

    # -- how many workers `up --spark-workers N` asked for (kept across `down`) -----------

    def recorded_workers(self) -> int:
        path = self.data_dir / _RECORD
        try:
            return max(0, int(path.read_text().strip()))
        except (OSError, ValueError):
            return 0

    def record_workers(self, count: int) -> None:
        path = self.data_dir / _RECORD
        if count <= 0:
            path.unlink(missing_ok=True)
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{count}\n")


class SparkWorkerService(Service):
    """Worker ``index``: its RPC port is the master's port + 10 + index (the master names its
    workers by it), its web UI on a port of the kernel's choosing."""

    stop_timeout = 60.0  # it stops its executors first

    def __init__(
        self, home: Path, index: int, master: SparkMasterService, cores: int, memory: str
    ) -> None:
        self.name = f"spark-worker-{index}"
        super().__init__(home)
        self.master = master
        self.port = master.port + 10 + index
        self.cores = cores
        self.memory = memory

    def ports(self) -> dict[int, str]:
        return {self.port: "TRIBUTARY_SPARK_MASTER_PORT (+10 + the worker's index)"}

    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port} -> {self.master.endpoint()}"

    def binaries(self) -> list[Path | str]:
        return self.master.binaries()

    def env(self) -> dict[str, str]:
        return {
            **_spark_env(spark_home(), self.data_dir, self.master.java_options),
            "SPARK_WORKER_DIR": str(self.data_dir / "work"),
            # the executors' Python: this interpreter, which imports the installed packages
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", _python()),
        }

    def argv(self) -> list[str]:
        return [
            str(spark_home() / "bin" / "spark-class"),
            "org.apache.spark.deploy.worker.Worker",
            self.master.endpoint(),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--webui-port", "0",
            "--cores", str(self.cores),
            "--memory", self.memory,
            "--work-dir", str(self.data_dir / "work"),
        ]  # fmt: skip

    def ready(self) -> bool:
        return self.port in self.master.alive_workers()


def resolve_master(spark_master: str, home: Path, port: int, ui_port: int) -> str:
    """The master URL the jobs use: ``spark_master`` as set, or for ``auto`` the local stack's
    master when it runs (its pid file names a live process), else :data:`LOCAL_MASTER`."""
    if spark_master != "auto":
        return spark_master
    master = SparkMasterService(home.resolve(), port, ui_port)
    return master.endpoint() if master.pid() is not None else LOCAL_MASTER


def _python() -> str:
    import sys

    return sys.executable
