"""Replay: rebuild a view from offset zero into a shadow generation, then swap it in.

The live view keeps serving reads (and its job keeps running) during the rebuild. The shadow
gets a new checkpoint and starts at the earliest offsets with ``trigger(availableNow=True)``;
when it has read everything that was in the topics at its start, the target swaps it in
atomically. If the rebuild fails, the shadow is dropped and the live view is left as it was.
A live job still on the old generation stops at its next batch and restarts on the new one.
"""

import logging
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from connectors.kafka import KafkaConfig, TopicAdmin
from connectors.stores.base import CommitHooks, new_generation
from projections.view import View
from spark_streaming.errors import ReplayError
from spark_streaming.view_job import BatchReport, JobOptions, ViewJob

log = logging.getLogger(__name__)

# Spark gives each Python process it starts on the driver (a streaming data source's runner, a
# transformWithState planner) 10 s to connect back, hard-coded; when many queries start at once
# on a loaded machine, one misses it. Nothing was applied then: the rebuild starts again.
WORKER_START_FAILED = re.compile(r"Python worker failed to connect back|CANNOT_OPEN_SOCKET")
REBUILD_ATTEMPTS = 3


@dataclass(frozen=True)
class ReplayResult:
    """A finished rebuild: the generation now live, the one it replaced, records read."""

    view: str
    generation: str
    replaced: str | None
    records: int
    batches: int
    busy_s: float = 0.0  # time inside micro-batches (the rest is query start-up and waiting)
    fold_s: float = 0.0  # reading and folding on the executors, to the driver
    write_s: float = 0.0  # the store's applies
    swap_s: float = 0.0


def topic_records(kafka: KafkaConfig, topics: tuple[str, ...]) -> int:
    """Offsets to read from zero to the true ends (the progress bar's total)."""
    infos = TopicAdmin(kafka).describe(list(topics))
    return sum(info.records for info in infos)


def replay(
    spark: Any,
    spec: View,
    kafka: KafkaConfig,
    options: JobOptions,
    *,
    on_batch: Callable[[BatchReport], None] | None = None,
    hooks: CommitHooks | None = None,
) -> ReplayResult:
    """Rebuild ``spec`` from offset zero and swap it in; raises :class:`ReplayError` on failure
    (the live view is then untouched). ``hooks`` reach the shadow sink (fault injection).

    A rebuild whose query could not start Spark's Python process in time
    (:data:`WORKER_START_FAILED`) is dropped and started again, up to
    :data:`REBUILD_ATTEMPTS` times in all."""
    for attempt in range(1, REBUILD_ATTEMPTS + 1):
        try:
            return _replay_once(spark, spec, kafka, options, on_batch=on_batch, hooks=hooks)
        except ReplayError as exc:
            if attempt == REBUILD_ATTEMPTS or not WORKER_START_FAILED.search(str(exc)):
                raise
            log.warning(
                "rebuild of %s: %s; starting it again (attempt %d)", spec.name, exc, attempt + 1
            )
            time.sleep(attempt)
    raise AssertionError("unreachable")


def _replay_once(
    spark: Any,
    spec: View,
    kafka: KafkaConfig,
    options: JobOptions,
    *,
    on_batch: Callable[[BatchReport], None] | None,
    hooks: CommitHooks | None,
) -> ReplayResult:
    generation = new_generation()
    for store in spec.stores:
        store.prepare(generation)
    totals = {"records": 0, "batches": 0}
    times = {"fold": 0.0, "write": 0.0}

    def count(report: BatchReport) -> None:
        totals["records"] += report.records
        totals["batches"] += 1
        times["fold"] += report.fold_s
        times["write"] += report.write_s
        if on_batch is not None:
            on_batch(report)

    job = ViewJob(
        spark,
        spec,
        kafka,
        options,
        generation=generation,
        live=False,
        hooks=hooks,
        on_batch=count,
    )
    query = None
    try:
        query = job.start(available_now=True)
        query.awaitTermination()
        problem = query.exception()
        if problem is not None:
            raise ReplayError(f"rebuild of {spec.name} failed: {problem}")
        if totals["records"] == 0:
            raise ReplayError(
                f"{', '.join(spec.topics)} holds no records (missing or empty topic?): nothing"
                f" to rebuild {spec.name} from; the live view is unchanged"
            )
        busy_s = (
            sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress) / 1000
        )
    except Exception as exc:
        if query is not None and query.isActive:
            query.stop()
        job.close()
        for store in spec.stores:
            store.discard(generation)
        shutil.rmtree(job.checkpoint, ignore_errors=True)
        if isinstance(exc, ReplayError):
            raise
        raise ReplayError(
            f"rebuild of {spec.name} failed, the live view is unchanged: {exc}"
        ) from exc
    job.close()
    began = time.perf_counter()
    try:
        for store in spec.also:
            store.swap_in(generation)
        replaced = spec.store.swap_in(generation)
    except Exception as exc:
        for store in spec.stores:
            if store.live_generation() != generation:
                store.discard(generation)
        raise ReplayError(f"swap of {spec.name} failed: {exc}") from exc
    swap_s = time.perf_counter() - began
    # The replaced generation's checkpoint stays until the live job restarts on the new
    # generation (it may still be running on it); ViewJob.start prunes it then.
    return ReplayResult(
        spec.name,
        generation,
        replaced,
        totals["records"],
        totals["batches"],
        busy_s,
        times["fold"],
        times["write"],
        swap_s,
    )
