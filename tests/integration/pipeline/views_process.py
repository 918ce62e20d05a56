"""`tributary run views` as a process the tests can kill -9 (with its JVM and Python workers)."""

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import Endpoints

ROOT = Path(__file__).resolve().parents[3]


class ViewsProcess:
    """The views of one test, run by the CLI in its own process group."""

    def __init__(self, stack: Endpoints, home: Path, **settings: str) -> None:
        self.home = home
        self.env = {
            **os.environ,
            "TRIBUTARY_HOME": str(home),
            "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
            **stack.settings.kafka_security_env(),  # SASL/TLS of a brought Kafka
            "TRIBUTARY_SCHEMA_REGISTRY_URL": stack.settings.registry_url,
            "TRIBUTARY_POSTGRES_URL": stack.database_url,
            "TRIBUTARY_REDIS_URL": stack.redis_url,
            "TRIBUTARY_VIEW_TRIGGER_INTERVAL_S": "0.5",
            "TRIBUTARY_VIEWS": "",  # only what the test configures
            **{f"TRIBUTARY_{k.upper()}": v for k, v in settings.items()},
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def start(self) -> None:
        self.runs += 1
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / f"views-{self.runs}.out", "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "infra.cli", "run", "views"],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: kill -9 reaches the JVM and workers
            )

    def output(self) -> str:
        return (self.home / f"views-{self.runs}.out").read_text(errors="replace")[-4000:]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.kill9()
            return None
