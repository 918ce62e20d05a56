"""Supervising the long-running parts: each in its own process, restarted when it dies.

A component that exits while the supervisor is not stopping is restarted after a backoff
that doubles from 1 s up to 30 s and resets once the component has stayed up for a minute.
Stopping (SIGTERM/SIGINT) sends SIGTERM to every component by PID, waits for each to finish
its batch and exit, and kills only one that outlives the grace period.

The supervisor keeps what it knows in ``<home>/run/parts.json`` (replaced atomically at each
change): its own PID and, per part, its PID, state, restarts, when it started and where its
metrics answer; ``tributary status`` and the dashboard read it.
"""

import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from infra.stack.process import spawn, stop_pid
from tributary.backoff import Backoff

if TYPE_CHECKING:
    from infra.settings import Settings


def parts_file(s: "Settings") -> Path:
    """Where ``tributary run`` keeps its parts' state (:func:`read_state`)."""
    return (s.home / "run" / "parts.json").resolve()


def metrics_url(s: "Settings", part: str) -> str | None:
    """Where a part's metrics answer (None: it serves none)."""
    port = s.metrics_port(part)
    if port <= 0:
        return None
    host = s.api_host if part == "api" else s.metrics_host
    return f"http://{host}:{port}/metrics"


log = logging.getLogger(__name__)

ArgvFor = Callable[[str], Sequence[str]]


@dataclass
class Child:
    """One supervised component and its current process."""

    name: str
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    started_wall: float = 0.0
    last_exit: int | None = None
    backoff: Backoff = field(default_factory=Backoff)
    next_start: float = field(default=0.0)


class Supervisor:
    """Starts each component, restarts those that die, stops them all on request."""

    def __init__(
        self,
        components: Sequence[str],
        argv_for: ArgvFor,
        log_dir: Path,
        announce: Callable[[str], None] = print,
        grace_s: float = 90.0,
        max_backoff_s: float = 30.0,
        stable_after_s: float = 60.0,
        state_file: Path | None = None,
        metrics_for: Callable[[str], str | None] | None = None,
    ) -> None:
        self.children = [
            Child(name, backoff=Backoff(max_s=max_backoff_s, stable_after_s=stable_after_s))
            for name in components
        ]
        self._argv_for = argv_for
        self._log_dir = log_dir
        self._announce = announce
        self._grace_s = grace_s
        self._state_file = state_file
        self._metrics_for = metrics_for or (lambda _name: None)
        self._stopping = False

    def _start(self, child: Child) -> None:
        child.process = spawn(
            self._argv_for(child.name),
            self._log_dir / f"run-{child.name}.log",
            die_with_parent=True,  # a kill -9 of the supervisor takes its children with it
        )
        child.started_at = time.monotonic()
        child.started_wall = time.time()
        self._announce(f"{child.name}: started (pid {child.process.pid})")
        self.write_state()

    def _check(self, child: Child, now: float) -> None:
        proc = child.process
        if proc is None:
            if now >= child.next_start:
                self._start(child)
            return
        code = proc.poll()
        if code is None:
            return
        child.process = None
        child.restarts += 1
        delay = child.backoff.next_delay(now - child.started_at)
        child.next_start = now + delay
        child.last_exit = code
        self._announce(
            f"{child.name}: exited with code {code}; restart #{child.restarts} "
            f"in {delay:.0f}s (log: {self._log_dir / f'run-{child.name}.log'})"
        )
        self.write_state()

    def run(self, stop: threading.Event, tick_s: float = 0.2) -> None:
        """Supervise until ``stop`` is set, then stop every component."""
        try:
            while not stop.is_set():
                now = time.monotonic()
                for child in self.children:
                    self._check(child, now)
                stop.wait(tick_s)
        finally:
            self.stop_all()

    def stop_all(self) -> None:
        self._stopping = True
        self.write_state()
        running = [c for c in self.children if c.process is not None and c.process.poll() is None]
        signalled = time.monotonic()
        for child in running:
            assert child.process is not None
            child.process.send_signal(signal.SIGTERM)
        # each part's own time to stop (they stop side by side): a slow one is named
        stopped_in: dict[str, float] = {}
        while len(stopped_in) < len(running) and time.monotonic() - signalled < self._grace_s:
            for child in running:
                assert child.process is not None
                if child.name not in stopped_in and child.process.poll() is not None:
                    stopped_in[child.name] = time.monotonic() - signalled
            time.sleep(0.05)
        for child in running:
            assert child.process is not None
            if child.name in stopped_in:
                self._announce(f"{child.name}: stopped in {stopped_in[child.name]:.1f}s")
            else:
                stop_pid(child.process.pid, signal.SIGKILL, 0)
                self._announce(f"{child.name}: stopped (killed after {self._grace_s:.0f}s)")
            child.process.wait()
            child.process = None
        self.write_state()

    def pids(self) -> dict[str, int | None]:
        return {c.name: (c.process.pid if c.process else None) for c in self.children}

    def state(self) -> dict[str, object]:
        """What ``parts.json`` holds."""
        parts = []
        for c in self.children:
            running = c.process is not None and c.process.poll() is None
            parts.append(
                {
                    "name": c.name,
                    "state": "up" if running else ("stopped" if self._stopping else "restarting"),
                    "pid": c.process.pid if running and c.process is not None else None,
                    "restarts": c.restarts,
                    "started_at": c.started_wall if running else None,
                    "last_exit": c.last_exit,
                    "metrics": self._metrics_for(c.name),
                    "log": str(self._log_dir / f"run-{c.name}.log"),
                }
            )
        return {
            "supervisor_pid": os.getpid(),
            "state": "stopping" if self._stopping else "running",
            "parts": parts,
        }

    def write_state(self) -> None:
        if self._state_file is None:
            return
        self._state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state()))
        tmp.replace(self._state_file)


def read_state(path: Path) -> dict[str, object] | None:
    """``parts.json`` as the supervisor last wrote it; when the supervisor is gone (killed),
    its parts are marked ``gone`` (their PIDs died with it). None: never written."""
    from infra.stack.process import is_alive

    try:
        state: dict[str, object] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    pid = state.get("supervisor_pid")
    if not isinstance(pid, int) or not is_alive(pid):
        state["state"] = "gone"
        parts = state.get("parts")
        if isinstance(parts, list):
            for part in parts:
                if isinstance(part, dict):
                    part["state"], part["pid"] = "gone", None
    return state
