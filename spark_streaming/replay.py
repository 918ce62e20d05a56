"""Replay: rebuild a view from offset zero into a shadow generation, verify it, swap it in.

The live view keeps serving reads (and its job keeps running) during the rebuild. The shadow
gets a new checkpoint and starts at the earliest offsets with ``trigger(availableNow=True)``.

**Verified rebuild.** The shadow is compared with the live generation *at the same source
offsets* before the swap: it is built up to exactly the offsets the live generation's stores
had committed when the rebuild started (the source's ``tributary.stopAt``), not to the topics'
ends. A live job that moved on meanwhile is followed: the shadow catches up to the live
generation's new offsets (another ``availableNow`` run of the same checkpoint, stopping there),
until both ledgers name the same offsets; then every store of the view lists both generations
by key and digest (:func:`~connectors.stores.compare.compare_generations`, each listing between
two reads of its ledger, so a batch committed during it is noticed and the round repeats).
Nothing pauses the live job: on an idle or slow view one round suffices; a view whose live job
commits a batch during every listing is given up after :data:`VERIFY_ROUNDS` rounds, the live
view unchanged. Differences refuse the swap (:class:`SwapRefusedError`, the shadow dropped)
unless ``force``; ``check_only`` compares and drops the shadow. A live generation that holds no
batch yet has nothing to compare with: the shadow is built to the topics' ends and swapped in.

If the rebuild fails, the shadow is dropped and the live view is left as it was. A live job
still on the old generation stops at its next batch and restarts on the new one.
"""

import json
import logging
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from connectors.kafka import KafkaConfig, TopicAdmin
from connectors.stores.compare import Comparison, compare_generations, same_offsets
from projections.view import View
from spark_streaming.errors import ReplayError
from spark_streaming.view_job import BatchReport, ViewJob, lowest
from tributary.view_model import Offsets, covers
from tributary.view_store import CommitHooks, new_generation
from views.catalog import JobOptions

log = logging.getLogger(__name__)

# Spark gives each Python process it starts on the driver (a streaming data source's runner, a
# transformWithState planner) 10 s to connect back, hard-coded; when many queries start at once
# on a loaded machine, one misses it. Nothing was applied then: the rebuild starts again.
WORKER_START_FAILED = re.compile(r"Python worker failed to connect back|CANNOT_OPEN_SOCKET")
REBUILD_ATTEMPTS = 3
VERIFY_ROUNDS = 5  # catch-ups of the shadow to a live generation that keeps moving
LIVE_WAIT_S = 60.0  # how long a live generation behind the shadow is waited for
LISTED_DIFFERENCES = 100  # differences listed with their entries, per store (all are counted)


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
    compare_s: float = 0.0  # catching up to the live generation and comparing
    comparisons: tuple[Comparison, ...] = ()  # one per store (none: nothing was compared)
    swapped: bool = True  # False: a --check-only comparison (the shadow was dropped)

    @property
    def compared(self) -> bool:
        return bool(self.comparisons)

    @property
    def identical(self) -> bool:
        return all(c.identical for c in self.comparisons)

    @property
    def different(self) -> int:
        return sum(c.different for c in self.comparisons)


class SwapRefusedError(ReplayError):
    """The rebuilt generation differs from the live one at the same offsets: not swapped in
    (the shadow was dropped, the live view is unchanged); ``result`` holds the comparisons."""

    def __init__(self, message: str, result: ReplayResult) -> None:
        super().__init__(message)
        self.result = result


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
    verify: bool = True,
    force: bool = False,
    check_only: bool = False,
) -> ReplayResult:
    """Rebuild ``spec`` from offset zero, compare it with the live generation at the same
    offsets (``verify``) and swap it in; raises :class:`ReplayError` on failure (the live view
    is then untouched) and :class:`SwapRefusedError` when the generations differ, unless
    ``force``. ``check_only``: compare, then drop the shadow (never swap). ``hooks`` reach the
    shadow sink (fault injection).

    A rebuild whose query could not start Spark's Python process in time
    (:data:`WORKER_START_FAILED`) is dropped and started again, up to
    :data:`REBUILD_ATTEMPTS` times in all."""
    for attempt in range(1, REBUILD_ATTEMPTS + 1):
        try:
            return _replay_once(
                spark,
                spec,
                kafka,
                options,
                on_batch=on_batch,
                hooks=hooks,
                verify=verify or check_only,
                force=force,
                check_only=check_only,
            )
        except ReplayError as exc:
            if attempt == REBUILD_ATTEMPTS or not WORKER_START_FAILED.search(str(exc)):
                raise
            log.warning(
                "rebuild of %s: %s; starting it again (attempt %d)", spec.name, exc, attempt + 1
            )
            time.sleep(attempt)
    raise AssertionError("unreachable")


def live_offsets(spec: View) -> Offsets | None:
    """Per partition, the least offset the live generations of the view's stores committed
    (None: a store's live generation holds no batch, there is nothing to compare with)."""
    commits = [store.committed(store.live_generation()) for store in spec.stores]
    if any(c.batches == 0 for c in commits):
        return None
    return lowest([c.offsets for c in commits])


def shadow_offsets(spec: View, generation: str) -> Offsets:
    return lowest([store.committed(generation).offsets for store in spec.stores])


def _replay_once(
    spark: Any,
    spec: View,
    kafka: KafkaConfig,
    options: JobOptions,
    *,
    on_batch: Callable[[BatchReport], None] | None,
    hooks: CommitHooks | None,
    verify: bool,
    force: bool,
    check_only: bool,
) -> ReplayResult:
    generation = new_generation()
    for store in spec.stores:
        store.prepare(generation)
    totals = {"records": 0, "batches": 0}
    times = {"fold": 0.0, "write": 0.0, "busy": 0.0, "compare": 0.0}

    def count(report: BatchReport) -> None:
        totals["records"] += report.records
        totals["batches"] += 1
        times["fold"] += report.fold_s
        times["write"] += report.write_s
        if on_batch is not None:
            on_batch(report)

    checkpoint = None

    def build(stop_at: Offsets | None) -> None:
        """One ``availableNow`` run of the shadow: to the topics' ends, or to ``stop_at``."""
        nonlocal checkpoint
        run_options = options
        if stop_at is not None:
            extra = {**options.extra_source_options, "tributary.stopAt": json.dumps(stop_at)}
            run_options = replace(options, extra_source_options=extra)
        job = ViewJob(
            spark,
            spec,
            kafka,
            run_options,
            generation=generation,
            live=False,
            hooks=hooks,
            on_batch=count,
        )
        checkpoint = job.checkpoint
        query = None
        try:
            query = job.start(available_now=True)
            query.awaitTermination()
            problem = query.exception()
            if problem is not None:
                raise ReplayError(f"rebuild of {spec.name} failed: {problem}")
            times["busy"] += (
                sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress) / 1000
            )
        finally:
            if query is not None and query.isActive:
                query.stop()
            job.close()

    comparisons: tuple[Comparison, ...] = ()
    try:
        target = live_offsets(spec) if verify else None
        build(target)
        if totals["records"] == 0:
            raise ReplayError(
                f"{', '.join(spec.topics)} holds no records (missing or empty topic?): nothing"
                f" to rebuild {spec.name} from; the live view is unchanged"
            )
        if target is not None:
            began = time.perf_counter()
            comparisons = _verify(spec, generation, build)
            times["compare"] = time.perf_counter() - began
    except Exception as exc:
        for store in spec.stores:
            store.discard(generation)
        if checkpoint is not None:
            shutil.rmtree(checkpoint, ignore_errors=True)
        if isinstance(exc, ReplayError):
            raise
        raise ReplayError(
            f"rebuild of {spec.name} failed, the live view is unchanged: {exc}"
        ) from exc

    def result(replaced: str | None, swapped: bool, swap_s: float = 0.0) -> ReplayResult:
        return ReplayResult(
            spec.name,
            generation,
            replaced,
            totals["records"],
            totals["batches"],
            times["busy"],
            times["fold"],
            times["write"],
            swap_s,
            times["compare"],
            comparisons,
            swapped,
        )

    differ = any(not c.identical for c in comparisons)
    if check_only or (differ and not force):
        for store in spec.stores:
            store.discard(generation)
        if checkpoint is not None:
            shutil.rmtree(checkpoint, ignore_errors=True)
        refused = result(None, False)
        if check_only:
            return refused
        raise SwapRefusedError(
            f"the rebuilt generation of {spec.name} differs from the live one in"
            f" {refused.different} entries at the same source offsets: the swap is refused"
            " (the live view is unchanged; --force swaps anyway)",
            refused,
        )
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
    # The replaced generation's checkpoint stays until the live job restarts on the new
    # generation (it may still be running on it); ViewJob.start prunes it then.
    return result(replaced, True, time.perf_counter() - began)


def _verify(
    spec: View, generation: str, build: Callable[[Offsets | None], None]
) -> tuple[Comparison, ...]:
    """Bring the shadow and the live generation to the same offsets and compare every store."""
    for _ in range(VERIFY_ROUNDS):
        live, shadow = live_offsets(spec), shadow_offsets(spec, generation)
        if live is None:
            raise ReplayError(f"the live generation of {spec.name} was emptied during the rebuild")
        if not same_offsets(live, shadow):
            if covers(live, shadow):
                build(live)  # the live job moved on: catch the shadow up to it
            else:
                _wait_for_live(spec, shadow)
            continue
        comparisons = tuple(
            compare_generations(
                store,
                store.live_generation(),
                generation,
                limit=LISTED_DIFFERENCES,
                positions=not spec.stateful,  # a stateful view's positions follow its batches
            )
            for store in spec.stores
        )
        if all(c.same_positions for c in comparisons):
            return comparisons
    raise ReplayError(
        f"the live generation of {spec.name} kept moving: it was not caught at the rebuilt"
        f" one's offsets in {VERIFY_ROUNDS} rounds; nothing swapped, the live view is unchanged"
        " (try again when it is quieter)"
    )


def _wait_for_live(spec: View, shadow: Offsets) -> None:
    """The shadow is past the live generation somewhere (a source that cannot stop at given
    offsets): wait for the live job to reach it."""
    deadline = time.monotonic() + LIVE_WAIT_S
    while time.monotonic() < deadline:
        live = live_offsets(spec)
        if live is not None and covers(live, shadow):
            return
        time.sleep(0.5)
    raise ReplayError(
        f"the live generation of {spec.name} is behind the rebuilt one ({json.dumps(shadow)})"
        f" and did not reach it in {LIVE_WAIT_S:.0f} s (is the view running?); nothing"
        " swapped, the live view is unchanged"
    )
