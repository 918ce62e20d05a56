"""The real CDC connector (`tributary run cdc`) as a process tests can stop and kill."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from infra.stack.process import is_alive
from tests.integration.conftest import Endpoints
from tests.integration.kafka_reading import wait_until


class CdcProcess:
    """One connector, run by the CLI in its own process, with its own state folder."""

    def __init__(self, stack: Endpoints, home: Path, name: str, tables: list[str], **extra: str):
        self.name = name
        self.home = home
        self.env = {
            **os.environ,
            "TRIBUTARY_HOME": str(home),
            "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
            **stack.settings.kafka_security_env(),  # SASL/TLS of a brought Kafka
            "TRIBUTARY_SCHEMA_REGISTRY_URL": stack.settings.registry_url,
            "TRIBUTARY_POSTGRES_URL": stack.database_url,
            "TRIBUTARY_CDC_CONNECTOR_NAME": name,
            "TRIBUTARY_CDC_TABLES": ",".join(tables),
            "TRIBUTARY_CDC_HEARTBEAT_MS": "1000",
            **{f"TRIBUTARY_{k.upper()}": v for k, v in extra.items()},
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    @property
    def status_path(self) -> Path:
        return self.home / "cdc" / f"{self.name}.status.json"

    @property
    def output_path(self) -> Path:
        return self.home / f"run-{self.runs}.out"

    def start(self) -> None:
        self.runs += 1
        self.status_path.unlink(missing_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.output_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "infra.cli", "run", "cdc"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def status(self) -> dict[str, object]:
        try:
            loaded: dict[str, object] = json.loads(self.status_path.read_text())
            return loaded
        except (OSError, ValueError):
            return {}

    def wait_running(self, timeout: float = 120) -> None:
        """Until the engine delivered its first batch (a heartbeat at the latest)."""

        def running() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"connector exited {self.proc.returncode}: {self.output()}")
            return self.status().get("state") == "running"

        wait_until(running, timeout, f"connector {self.name} to run")

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")[-3000:]

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def terminate(self, timeout: float = 90) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def wait_exit(self, timeout: float = 120) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is not None and is_alive(self.proc.pid):
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
