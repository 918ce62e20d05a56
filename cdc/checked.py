"""What `verify` has read of each topic, so the next run reads only what came after.

A checkpoint is, per topic, the offset each partition was read to and a summary of what was
read (the latest change per key of a CDC topic, the event ids of an event topic). It is a JSON
file per topic in one folder, replaced atomically, so two verifies at once (the periodic one of
`tributary run` and a user's) each leave a valid one.

What a checkpoint trusts: a record read once stays on its topic. Kafka keeps that promise for
every record a consumer could read (it is below the high watermark, on every in-sync replica);
an unclean leader election breaks it, and so does a broker that loses the batches it wrote last
before a crash if a verify read them in that moment. A topic whose partition now ends below the
offset read is noticed and read whole again; for the rest, ``tributary verify --full`` reads
every topic whole and replaces the checkpoints.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = 1


@dataclass
class Checkpoint:
    """Offsets read to, per partition, and the summary of the records below them."""

    ends: dict[int, int]
    summary: dict[str, Any]


class CheckedTopics:
    """Checkpoints in ``folder`` (``None``: none kept, every read is whole)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder

    def _path(self, kind: str, topic: str) -> Path | None:
        if self.folder is None:
            return None
        return self.folder / f"{kind}-{topic.replace(os.sep, '_')}.json"

    def load(self, kind: str, topic: str) -> Checkpoint | None:
        path = self._path(kind, topic)
        if path is None:
            return None
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            return None
        ends = {int(p): int(o) for p, o in raw.get("ends", {}).items()}
        summary = raw.get("summary")
        return Checkpoint(ends, summary) if isinstance(summary, dict) else None

    def save(self, kind: str, topic: str, checkpoint: Checkpoint) -> None:
        path = self._path(kind, topic)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(
            json.dumps(
                {
                    "format": FORMAT,
                    "topic": topic,
                    "ends": {str(p): o for p, o in checkpoint.ends.items()},
                    "summary": checkpoint.summary,
                },
                separators=(",", ":"),
            )
        )
        tmp.replace(path)

    def drop(self, kind: str, topic: str) -> None:
        """Forget a topic (it is gone: a topic created again under its name starts afresh)."""
        path = self._path(kind, topic)
        if path is not None:
            path.unlink(missing_ok=True)
