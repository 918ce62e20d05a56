"""Processes the stack owns: spawn, identify by pidfile, stop by PID.

A pidfile holds the PID and the kernel's start time of the process so that a
recycled PID is never mistaken for ours. Processes are only ever signalled by
the PID we recorded, never looked up by name.
"""

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; everything after its ')' splits cleanly.
    return raw[raw.rfind(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def is_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (reaping it if it is our child)."""
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def children(pid: int) -> list[int]:
    """Direct children of a process (read from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields and int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_accepts(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class PidFile:
    """``<state>/run/<name>.pid``: ``"<pid> <start time>"``."""

    path: Path

    def write(self, pid: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(f"{pid} {start_time(pid) or 0}\n")

    def running_pid(self) -> int | None:
        """The recorded PID if that very process still runs; clears a stale file."""
        try:
            pid_text, started = self.path.read_text().split()
        except (OSError, ValueError):
            return None
        pid = int(pid_text)
        if is_alive(pid) and str(start_time(pid)) == started:
            return pid
        self.path.unlink(missing_ok=True)
        return None

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


_PR_SET_PDEATHSIG = 1


def spawn(
    argv: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    user: str | None = None,
    cwd: Path | None = None,
    die_with_parent: bool = False,
) -> subprocess.Popen[bytes]:
    """Start a detached process (own session) with stdout and stderr appended to a log file.

    ``die_with_parent``: the kernel sends the process SIGTERM when its parent dies, even by
    ``kill -9`` (``PR_SET_PDEATHSIG``), so a supervisor's children never outlive it; a
    service of the local stack is meant to outlive the command that started it.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    parent = os.getpid()

    def end_with_parent() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(1)

    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            user=user,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=end_with_parent if die_with_parent else None,
        )


def stop_pid(pid: int, sig: int = signal.SIGTERM, timeout: float = 30.0) -> bool:
    """Signal one PID and wait for it to exit; SIGKILL after the timeout. True if graceful."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    while is_alive(pid):
        time.sleep(0.05)
    return False


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
