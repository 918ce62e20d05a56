"""The connector's status file, written by the running connector and read by ``status``."""

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

State = Literal["starting", "running", "stopping", "stopped", "failed"]


@dataclass
class ConnectorStatus:
    name: str
    state: State = "starting"
    pid: int = field(default_factory=os.getpid)
    started_at: float = field(default_factory=time.time)
    records_published: int = 0
    batches: int = 0
    last_change_at: float | None = None
    last_lsn: int | None = None
    # Where the handler's time goes: reading records out of the JVM and routing them, and
    # producing them until Kafka acknowledged. The rest of the wall time is Debezium's.
    read_seconds: float = 0.0
    publish_seconds: float = 0.0
    record_seconds: float = 0.0  # of publish_seconds: recording published_streams
    # who produces the table changes: "jvm" (Kafka's Java producer) or "python"
    publisher: str = "python"
    error: str | None = None
    recovered: str | None = None  # e.g. a fresh snapshot after the slot was invalidated

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class StatusFile:
    """``<home>/run/cdc-<name>.json``, replaced atomically on every write."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # The engine's thread (after each batch) and the main thread (on a stop) both write:
        # one at a time, or one's replace finds the other's temporary file gone.
        self._lock = threading.Lock()

    def write(self, status: ConnectorStatus) -> None:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(status.as_dict()))
            os.replace(tmp, self.path)

    def read(self) -> ConnectorStatus | None:
        try:
            return ConnectorStatus(**json.loads(self.path.read_text()))
        except (OSError, ValueError, TypeError):
            return None
