"""What every local service provides to the stack."""

import signal
import subprocess
import time
from abc import ABC, abstractmethod
from pathlib import Path

from infra.errors import StartTimeoutError
from infra.stack.process import PidFile, is_alive, log_tail, spawn, stop_pid


class Service(ABC):
    """A real process of the local stack, under ``<home>/<name>`` with a log and a pidfile."""

    name: str
    stop_signal: int = signal.SIGTERM
    stop_timeout: float = 30.0
    # How to stop it when its data is deleted right after (``down --purge``): None stops it
    # gracefully as always; a single-process service with nothing else to clean may be killed.
    discard_signal: int | None = None
    # Free space on its disk below which the service stops working (0: none it knows of).
    min_free_bytes: int = 0

    def __init__(self, home: Path) -> None:
        self.home = home
        self.pidfile = PidFile(home / "run" / f"{self.name}.pid")
        self.log_path = home / "logs" / f"{self.name}.log"

    @property
    def data_dir(self) -> Path:
        return self.home / self.name

    @abstractmethod
    def ports(self) -> dict[int, str]:
        """Each port the service binds, mapped to the setting that chooses it."""

    @abstractmethod
    def endpoint(self) -> str:
        """How a client reaches the service."""

    @abstractmethod
    def binaries(self) -> list[Path | str]:
        """Programs that must exist (checked before anything starts)."""

    @abstractmethod
    def argv(self) -> list[str]: ...

    def env(self) -> dict[str, str]:
        return {}

    def user(self) -> str | None:
        return None

    def prepare(self) -> None:
        """Create the data folder and config (idempotent)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)

    @abstractmethod
    def ready(self) -> bool:
        """True once the service answers a real request."""

    def after_ready(self) -> None:  # noqa: B027 - optional hook
        """One-time set-up that needs the running service (idempotent)."""

    def cleanup_after_stop(self) -> None:  # noqa: B027 - optional hook
        """Remove files the process leaves outside the state folder."""

    # -- lifecycle -----------------------------------------------------------------------

    def pid(self) -> int | None:
        return self.pidfile.running_pid()

    def start(self) -> subprocess.Popen[bytes]:
        self.prepare()
        proc = spawn(self.argv(), self.log_path, env=self.env(), user=self.user())
        self.pidfile.write(proc.pid)
        return proc

    def wait_ready(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None or not is_alive(proc.pid):
                self.pidfile.clear()
                raise StartTimeoutError(
                    f"{self.name} exited with code {proc.returncode} while starting; "
                    f"log {self.log_path}:\n{log_tail(self.log_path)}"
                )
            if self.ready():
                self.after_ready()
                return
            time.sleep(0.1)
        raise StartTimeoutError(
            f"{self.name} did not answer on {self.endpoint()} within {timeout:.0f}s "
            f"(raise TRIBUTARY_START_TIMEOUT_S if the machine is slow); "
            f"log {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def stop(self, discard: bool = False) -> None:
        """Stop the process; ``discard``: its data is deleted next, so nothing need be kept."""
        pid = self.pid()
        if pid is not None:
            if discard and self.discard_signal is not None:
                stop_pid(pid, self.discard_signal, self.stop_timeout)
            else:
                stop_pid(pid, self.stop_signal, self.stop_timeout)
        self.pidfile.clear()
        self.cleanup_after_stop()
