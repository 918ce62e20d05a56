"""Spark's checkpoint of a view query, read and reconciled with the view's store.

The store holds the truth: a view resumes from the offsets its store committed. Spark's
checkpoint is kept only while it agrees with the store. Its offset log (``offsets/<batch>``:
a version line, a metadata line, then one JSON line of offsets per source) says where each
planned batch ends; ``commits/<batch>`` marks the batches Spark finished.

- no checkpoint: the query starts at the store's offsets;
- the checkpoint resumes at or behind the store (a crash after the store's commit, or an old
  copy restored): kept; the records the store already has are filtered out of each batch;
- the checkpoint resumes ahead of the store (the store was restored from an older backup, lost
  its last seconds, or the checkpoint belongs to another run): it would skip records, so it is
  moved aside and the query restarts from the store's offsets. The reason is logged.
"""

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from tributary.view_model import Offsets, covers


@dataclass(frozen=True)
class Reconciliation:
    """What was done with a checkpoint before starting its query, and why."""

    action: str  # "fresh" (none), "kept", "reset" (moved aside)
    reason: str
    moved_to: Path | None = None


class CheckpointLog:
    """Read access to a streaming query's checkpoint folder."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _batches(self, folder: str) -> list[int]:
        base = self.path / folder
        if not base.is_dir():
            return []
        return sorted(int(p.name) for p in base.iterdir() if p.name.isdigit())

    def offsets(self, batch_id: int) -> Offsets | None:
        """Where batch ``batch_id`` ends (None: not planned, or unreadable)."""
        file = self.path / "offsets" / str(batch_id)
        try:
            lines = file.read_text().splitlines()
        except OSError:
            return None
        if len(lines) < 3 or not lines[0].startswith("v"):
            return None
        try:
            parsed = json.loads(lines[2])
        except json.JSONDecodeError:
            return None
        if not isinstance(parsed, dict):
            return None
        return {str(t): {str(p): int(o) for p, o in parts.items()} for t, parts in parsed.items()}

    def last_planned(self) -> int | None:
        batches = self._batches("offsets")
        return batches[-1] if batches else None

    def last_committed(self) -> int | None:
        batches = self._batches("commits")
        return batches[-1] if batches else None

    def resumes_at(self) -> Offsets | None:
        """Where the query would start reading when restarted (None: nothing planned yet).

        A planned but uncommitted batch is re-run with its logged range, which starts where
        the batch before it ended.
        """
        planned, committed = self.last_planned(), self.last_committed()
        if planned is None:
            return None
        if committed is not None and committed >= planned:
            return self.offsets(planned)
        return self.offsets(planned - 1) if planned > 0 else {}


def reconcile(path: Path, store: Offsets, topics: tuple[str, ...]) -> Reconciliation:
    """Keep the checkpoint at ``path`` if it agrees with the store's offsets, else move it aside
    (``<path>.reset-<time>``) so the query restarts from the store."""
    decision = assess(path, store, topics)
    if decision.action != "reset":
        return decision
    moved = path.with_name(f"{path.name}.reset-{int(time.time() * 1000)}")
    shutil.move(str(path), str(moved))
    return Reconciliation("reset", decision.reason, moved)


def assess(path: Path, store: Offsets, topics: tuple[str, ...]) -> Reconciliation:
    """What :func:`reconcile` would do with the checkpoint at ``path``, doing nothing."""
    log = CheckpointLog(path)
    if not path.exists():
        return Reconciliation("fresh", "no checkpoint: starting at the store's offsets")
    resumes = log.resumes_at()
    if resumes is None:
        reason = "checkpoint has no planned batch"
    elif set(resumes) - set(topics) or (resumes and set(topics) - set(resumes)):
        reason = f"checkpoint reads {sorted(resumes)}, the view reads {sorted(topics)}"
    elif covers(store, resumes):
        return Reconciliation(
            "kept",
            "checkpoint resumes at or behind the store; records the store has are skipped",
        )
    else:
        ahead = [
            f"{t}[{p}] checkpoint {o} > store {store.get(t, {}).get(p, 'none')}"
            for t, parts in sorted(resumes.items())
            for p, o in sorted(parts.items())
            if store.get(t, {}).get(p, -1) < o
        ]
        reason = "checkpoint is ahead of the store (" + "; ".join(ahead) + ")"
    return Reconciliation("reset", reason + ": restarting from the store's offsets")


def starting_offsets(store: Offsets) -> str:
    """``startingOffsets`` for a query that starts at the store's offsets (JSON), or earliest.

    Partitions the store has not reached start at the earliest offset (Spark's -2).
    """
    if not store:
        return "earliest"
    return json.dumps(store, sort_keys=True)
