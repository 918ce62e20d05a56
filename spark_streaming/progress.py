"""Where each trigger of a view's query spends its time, as Spark reports it.

Spark times every trigger of a streaming query by phase (``durationMs`` of its progress:
``latestOffset``, ``queryPlanning``, ``getBatch``, ``addBatch`` - the ``foreachBatch`` body,
where the fold and the store's apply run -, ``walCommit``, ``commitOffsets`` and the whole,
``triggerExecution``). A view job reads its query's last progress when its next batch starts
(a trigger's progress is complete only after the trigger) and hands the phases to a callback
(the views process's metrics), so an operator sees the split a Spark user reads in
``query.lastProgress``.

Read this way, not through a ``StreamingQueryListener``: a Python listener is called through
the JVM for every event of every query (idle triggers included), and cost the views' JVM about
an eighth of a core on the latency bench; one ``lastProgress`` per batch costs next to nothing.
"""

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["PhaseCallback", "trigger_phases"]

PhaseCallback = Callable[[str, Mapping[str, float]], None]
"""Called with the view's name and one trigger's phases in seconds."""


def trigger_phases(progress: Mapping[str, Any] | None, after: int) -> tuple[int, dict[str, float]]:
    """The batch id and phases (seconds) of ``progress`` (a query's ``lastProgress``) when it
    is a trigger after batch ``after`` that ran a batch; else ``(after, {})``."""
    if not progress:
        return after, {}
    batch_id = progress.get("batchId")
    durations = progress.get("durationMs")
    if not isinstance(batch_id, int) or batch_id <= after or not isinstance(durations, Mapping):
        return after, {}
    if "addBatch" not in durations:  # a trigger that found no new data ran no batch
        return after, {}
    return batch_id, {phase: float(ms) / 1000 for phase, ms in durations.items()}
