"""Where each trigger of a view's query spends its time, as Spark reports it.

Spark times every trigger of a streaming query by phase (``durationMs`` of its progress:
``latestOffset``, ``queryPlanning``, ``getBatch``, ``addBatch`` - the ``foreachBatch`` body,
where the fold and the store's apply run -, ``walCommit``, ``commitOffsets`` and the whole,
``triggerExecution``). A :class:`TriggerPhases` listener hands them, per view, to a callback
(the views process's metrics), so an operator sees the same split a Spark user reads in
``query.lastProgress``.
"""

from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

__all__ = ["TriggerPhases", "view_of_query", "watch_trigger_phases"]

PhaseCallback = Callable[[str, Mapping[str, float]], None]
"""Called with the view's name and its trigger's phases in seconds."""

WARM_UP_SUFFIX = ".warm-up"


def view_of_query(name: str | None) -> str | None:
    """The view a query runs (its name is ``<view>.<generation>``), or None for a query that is
    not a view's generation (unnamed, or a standby's warm-up)."""
    if not name or name.endswith(WARM_UP_SUFFIX) or "." not in name:
        return None
    return name.rsplit(".", 1)[0]


class TriggerPhases(StreamingQueryListener):
    """A listener of the session's streaming queries: each progress of a view's query goes to
    ``on_phases`` (exceptions are swallowed: metrics never stop a query)."""

    def __init__(self, on_phases: PhaseCallback) -> None:
        self.on_phases = on_phases

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        view = view_of_query(progress.name)
        if view is None:
            return
        try:
            phases = {phase: ms / 1000 for phase, ms in dict(progress.durationMs).items()}
            self.on_phases(view, phases)
        except Exception:  # a metrics failure is not the query's
            return

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def watch_trigger_phases(spark: Any, on_phases: PhaseCallback) -> TriggerPhases:
    """Register a :class:`TriggerPhases` listener on ``spark``'s queries; returns it (for
    ``spark.streams.removeListener``)."""
    listener = TriggerPhases(on_phases)
    spark.streams.addListener(listener)
    return listener
