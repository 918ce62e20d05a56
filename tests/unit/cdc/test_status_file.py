"""The connector's status file: written by two threads at once (the engine's after each batch,
the main thread on a stop), it is always whole and no write fails."""

import json
import threading
from pathlib import Path

from cdc.status import ConnectorStatus, StatusFile


def test_two_threads_writing_at_once_neither_fails(tmp_path: Path) -> None:
    status_file = StatusFile(tmp_path / "cdc.status.json")
    errors: list[BaseException] = []

    def write(state: str) -> None:
        status = ConnectorStatus("c", state="running" if state == "a" else "stopping")
        try:
            for _ in range(1500):
                status_file.write(status)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(name,)) for name in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert json.loads(status_file.path.read_text())["state"] in ("running", "stopping")
    assert StatusFile(status_file.path).read() is not None
