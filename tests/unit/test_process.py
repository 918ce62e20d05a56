import socket
import subprocess
import sys
from pathlib import Path

from infra.stack.process import PidFile, is_alive, port_is_free, stop_pid


def test_pidfile_tracks_the_process_and_forgets_a_dead_one(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    pidfile = PidFile(tmp_path / "run" / "x.pid")
    pidfile.write(proc.pid)
    assert pidfile.running_pid() == proc.pid
    assert stop_pid(proc.pid, timeout=5) is True
    assert not is_alive(proc.pid)
    assert pidfile.running_pid() is None
    assert not pidfile.path.exists()


def test_pidfile_rejects_a_recycled_pid(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pidfile = PidFile(tmp_path / "x.pid")
        pidfile.path.write_text(f"{proc.pid} 1\n")  # same PID, another start time
        assert pidfile.running_pid() is None
    finally:
        proc.kill()
        proc.wait()


def test_stop_pid_escalates_when_the_signal_is_ignored() -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ok', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ok\n"
    assert stop_pid(proc.pid, timeout=0.5) is False
    assert not is_alive(proc.pid)


def test_port_is_free() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert not port_is_free(sock.getsockname()[1])
