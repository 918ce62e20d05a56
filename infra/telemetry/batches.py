"""The views process's metrics, from each micro-batch's report
(:class:`spark_streaming.view_job.BatchReport`, through the runner's ``on_batch``)."""

import time
from collections.abc import Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry

from infra.telemetry.families import Family

__all__ = ["BATCH_BUCKETS_S", "BatchFacts", "ViewBatchMetrics"]

BATCH_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

BATCHES = Family(
    "counter",
    "tributary_view_batches",
    "Micro-batches of the view (applied=false: the store already had the batch).",
    ("view", "applied"),
)
RECORDS_IN = Family(
    "counter",
    "tributary_view_records_in",
    "Kafka offsets the view's micro-batches read.",
    ("view",),
)
ROWS_OUT = Family(
    "counter",
    "tributary_view_rows_out",
    "Folded rows (one per changed key) the view wrote to its store.",
    ("view",),
)
DEAD_LETTERS = Family(
    "counter",
    "tributary_view_dead_letters",
    "Records the view sent to its dead-letter topic dlq.<view>.",
    ("view",),
)
DURATION = Family(
    "histogram",
    "tributary_view_batch_duration_seconds",
    "Time of a micro-batch by stage: fold (read + fold + transfer) and write (the"
    " store's atomic apply).",
    ("view", "stage"),
    BATCH_BUCKETS_S,
)
LAST_DURATION = Family(
    "gauge",
    "tributary_view_last_batch_duration_seconds",
    "The last micro-batch's time by stage (fold, write).",
    ("view", "stage"),
)
PHASES = Family(
    "histogram",
    "tributary_view_trigger_phase_seconds",
    "Time of each trigger of the view's query by Spark's phase (durationMs of its"
    " progress: latestOffset, queryPlanning, getBatch, addBatch, walCommit,"
    " commitOffsets, and the whole: triggerExecution).",
    ("view", "phase"),
    BATCH_BUCKETS_S,
)
LAST_AT = Family(
    "gauge",
    "tributary_view_last_batch_timestamp_seconds",
    "When the view's last micro-batch ended (Unix time).",
    ("view",),
)


class BatchFacts(Protocol):
    """What a batch report carries that the metrics read."""

    @property
    def view(self) -> str: ...
    @property
    def records(self) -> int: ...
    @property
    def folded(self) -> int: ...
    @property
    def rejected(self) -> int: ...
    @property
    def applied(self) -> bool: ...
    @property
    def fold_s(self) -> float: ...
    @property
    def write_s(self) -> float: ...


class ViewBatchMetrics:
    """Counters, histograms and gauges of the views' micro-batches, labelled ``view``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.batches = BATCHES.counter(registry)
        self.records_in = RECORDS_IN.counter(registry)
        self.rows_out = ROWS_OUT.counter(registry)
        self.dead_letters = DEAD_LETTERS.counter(registry)
        self.duration = DURATION.histogram(registry)
        self.last_duration = LAST_DURATION.gauge(registry)
        self.phases = PHASES.histogram(registry)
        self.last_at = LAST_AT.gauge(registry)

    def observe(self, report: BatchFacts) -> None:
        """Count one batch (the runner's ``on_batch``)."""
        view = report.view
        self.batches.labels(view, "true" if report.applied else "false").inc()
        self.records_in.labels(view).inc(report.records)
        if report.applied:
            self.rows_out.labels(view).inc(report.folded)
        self.dead_letters.labels(view).inc(report.rejected)
        for stage, seconds in (("fold", report.fold_s), ("write", report.write_s)):
            self.duration.labels(view, stage).observe(seconds)
            self.last_duration.labels(view, stage).set(seconds)
        self.last_at.labels(view).set(time.time())

    def observe_phases(self, view: str, phases: Mapping[str, float]) -> None:
        """Record one trigger's phases (seconds), as :mod:`spark_streaming.progress` hears them."""
        for phase, seconds in phases.items():
            self.phases.labels(view, phase).observe(seconds)
