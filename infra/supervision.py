"""Supervising the long-running parts: each in its own process, restarted when it dies.

A component that exits while the supervisor is not stopping is restarted after a backoff
that doubles from 1 s up to 30 s and resets once the component has stayed up for a minute.
Stopping (SIGTERM/SIGINT) sends SIGTERM to every component by PID, waits for each to finish
its batch and exit, and kills only one that outlives the grace period.
"""

import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from infra.stack.process import spawn, stop_pid
from tributary.backoff import Backoff

log = logging.getLogger(__name__)

ArgvFor = Callable[[str], Sequence[str]]


@dataclass
class Child:
    """One supervised component and its current process."""

    name: str
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
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
    ) -> None:
        self.children = [
            Child(name, backoff=Backoff(max_s=max_backoff_s, stable_after_s=stable_after_s))
            for name in components
        ]
        self._argv_for = argv_for
        self._log_dir = log_dir
        self._announce = announce
        self._grace_s = grace_s

    def _start(self, child: Child) -> None:
        child.process = spawn(
            self._argv_for(child.name),
            self._log_dir / f"run-{child.name}.log",
            die_with_parent=True,  # a kill -9 of the supervisor takes its children with it
        )
        child.started_at = time.monotonic()
        self._announce(f"{child.name}: started (pid {child.process.pid})")

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
        self._announce(
            f"{child.name}: exited with code {code}; restart #{child.restarts} "
            f"in {delay:.0f}s (log: {self._log_dir / f'run-{child.name}.log'})"
        )

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
        running = [c for c in self.children if c.process is not None and c.process.poll() is None]
        for child in running:
            assert child.process is not None
            child.process.send_signal(signal.SIGTERM)
        for child in running:
            assert child.process is not None
            graceful = stop_pid(child.process.pid, signal.SIGTERM, self._grace_s)
            child.process.wait()
            self._announce(
                f"{child.name}: stopped"
                + ("" if graceful else f" (killed after {self._grace_s:.0f}s)")
            )

    def pids(self) -> dict[str, int | None]:
        return {c.name: (c.process.pid if c.process else None) for c in self.children}
