"""A streaming query per view: Kafka source -> fold on the executors -> the view's store (views
that fold per partition may share one query instead: :mod:`spark_streaming.view_group`).

Each generation of a view has its own checkpoint (``<root>/<view>/<generation>``), but the
store holds the truth: the query starts at the offsets the store committed (a checkpoint that
disagrees is moved aside, see :mod:`spark_streaming.checkpoint`), and every micro-batch is
checked against the store before it is applied - a batch the store already has is skipped, the
records of a batch the store partly has are filtered out, a batch that would leave a gap is
refused. In each micro-batch (``foreachBatch``):

1. the batch's end offsets come from Spark's offset log, its start from the batch before;
2. the view's fold runs on the executors (inside the Kafka source's read task when it folds
   per partition); only folded rows come back to the driver, as Arrow;
3. dead letters (records the fold refused) go to ``dlq.<view>``;
4. the store applies the writes with the batch's offsets in one atomic unit; writes the store
   refuses go to ``dlq.<view>`` before it commits.
"""

import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connectors.errors import LedgerGapError
from connectors.kafka import KafkaConfig
from projections.view import PartitionFold, View, dead_letters_of, split_folded
from spark_streaming.checkpoint import (
    CheckpointLog,
    Reconciliation,
    assess,
    reconcile,
    starting_offsets,
)
from spark_streaming.errors import CheckpointLostError, StreamingError
from spark_streaming.progress import PhaseCallback, trigger_phases
from spark_streaming.stream import folded_stream, records_stream
from tributary.view_model import Batch, Offsets, Rejected, covers, gaps, merge_offsets
from tributary.view_store import CommitHooks, RejectHandler, StoreWriter
from views.catalog import JobOptions
from views.dead_letters import DeadLetterQueue
from views.lag import LagCommitter


@dataclass(frozen=True)
class BatchReport:
    """What one micro-batch did, and where its time went (seconds)."""

    view: str
    generation: str
    batch_id: int
    records: int  # offsets the batch spans
    folded: int  # folded rows that reached the driver
    rejected: int  # dead letters
    applied: bool  # False: the store already had the batch
    offsets: dict[str, dict[str, int]]
    fold_s: float = 0.0  # source read + fold on the executors + transfer to the driver
    write_s: float = 0.0  # the store's atomic apply (with the materializer)


PY4J_ERROR = "Py4JJavaError"
SUMMARY_CHARS = 1500
WARM_UP_RECORDS = 200  # records a standby folds (and drops) to start Spark's Python processes

BatchFunction = Callable[[Any, int], None]


def java_summary(exc: BaseException, causes: int = 6) -> str:
    """A failure in one line: each exception of the chain (for a JVM error, the Java exception
    and its causes, without their stack traces) by its first and its last line."""
    parts: list[str] = []
    current: BaseException | None = exc
    while current is not None and len(parts) < causes:
        java = getattr(current, "java_exception", None)
        if java is None:
            parts.append(f"{type(current).__name__}: {current}")
        while java is not None and len(parts) < causes:
            parts.append(str(java.toString()))
            java = java.getCause()
        current = current.__cause__ or current.__context__
    lines = []
    for part in parts:
        kept = [line.strip() for line in part.splitlines() if line.strip()]
        lines.append(" ... ".join(dict.fromkeys([kept[0], kept[-1]])) if kept else "")
    # Keep Spark's pattern (see ``batch_errors_in_brief``) from matching the text.
    return " <- ".join(lines).replace(PY4J_ERROR + ":", PY4J_ERROR + " -")[:SUMMARY_CHARS]


def batch_errors_in_brief(function: BatchFunction, what: str = "query") -> BatchFunction:
    """A foreachBatch function whose failures that went through the JVM (a ``Py4JJavaError``:
    a Spark job that failed, a Java error pyspark does not translate) leave as a
    :class:`StreamingError` of one line; the whole trace goes to stderr first.

    When a query is being stopped (``query.stop()`` cancels the running batch's Spark job, whose
    error pyspark leaves a ``Py4JJavaError``), Spark tells a stop from a failure by matching the
    Python traceback of the foreachBatch error against ``py4j.protocol.Py4JJavaError: An error
    occurred while calling((.|\\r\\n|\\r|\\n)*)(...)``
    (``StreamExecution.isInterruptionException``).
    That regex recurses once per character after the phrase, so the Java stack trace a
    ``Py4JJavaError`` carries (thousands of characters) overflows the stream thread's stack:
    the query dies of a ``StackOverflowError`` that hides the real error and leaves no
    exception on the query. A larger thread stack only moves the limit; the text must stay
    short. The price: a batch cancelled by ``query.stop()`` mid-run ends the query as failed
    (with that one-line error) instead of as stopped; the store's ledger is untouched either
    way, and the next start resumes from the offsets the store committed.
    """

    def guarded(batch: Any, batch_id: int) -> None:
        try:
            function(batch, batch_id)
        except Exception as exc:
            trace = "".join(traceback.format_exception(exc))
            if PY4J_ERROR not in trace:
                raise
            print(trace, file=sys.stderr, flush=True)
            raise StreamingError(f"{what}: batch {batch_id} failed: {java_summary(exc)}") from None

    return guarded


def lowest(offsets: list[Offsets]) -> Offsets:
    """Per partition, the least offset any store reached (a partition some store has not
    reached at all is left out: it starts at the earliest offset)."""
    if not offsets:
        return {}
    out: Offsets = {}
    for topic, parts in offsets[0].items():
        for partition, offset in parts.items():
            others = [o.get(topic, {}).get(partition) for o in offsets[1:]]
            known = [other for other in others if other is not None]
            if len(known) == len(others):
                out.setdefault(topic, {})[partition] = min([offset, *known])
    return out


def checkpoint_dir(root: Path, view: str, generation: str) -> Path:
    """The checkpoint folder of one generation of a view."""
    return root / view / generation


def span(start: Offsets, end: Offsets) -> int:
    """Offsets between two positions of a batch."""
    return sum(
        max(0, offset - start.get(topic, {}).get(partition, 0))
        for topic, parts in end.items()
        for partition, offset in parts.items()
    )


def batch_range(
    checkpoint: Path, batch_id: int, initial: Offsets, what: str
) -> tuple[Offsets, Offsets]:
    """Where a micro-batch starts and ends: its end offsets from Spark's offset log, its start
    from the batch before (``initial``, where the query started, for its first batch)."""
    log = CheckpointLog(checkpoint)
    end = log.offsets(batch_id)
    if end is None:
        raise StreamingError(f"{what}: batch {batch_id} has no offsets in {checkpoint}")
    start = log.offsets(batch_id - 1) if batch_id > 0 else None
    return (initial if start is None else start), end


def start_query(
    stream: Any,
    name: str,
    output_mode: str,
    checkpoint: Path,
    on_batch: BatchFunction,
    trigger_interval_s: float,
    *,
    available_now: bool = False,
) -> Any:
    """Start ``stream`` as a query named ``name`` whose micro-batches go to ``on_batch``."""
    writer = (
        stream.writeStream.queryName(name)
        .outputMode(output_mode)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(on_batch)
    )
    if available_now:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime=f"{trigger_interval_s} seconds").start()


def warm_up_query(stream: Any, name: str, output_mode: str, timeout_s: float) -> int:
    """Run ``stream``'s first micro-batch into a throw-away checkpoint and drop its rows
    (Spark's Python processes start and import the fold). Returns the rows it made."""
    made: list[int] = []
    done = threading.Event()

    def batch(folded: Any, _batch_id: int) -> None:
        made.append(len(folded.toArrow()))
        done.set()

    with tempfile.TemporaryDirectory(prefix=f"tributary-warm-{name}-") as folder:
        query = start_query(
            stream, f"{name}.warm-up", output_mode, Path(folder), batch, 0.0, available_now=True
        )
        try:
            began = time.monotonic()
            while not done.wait(0.1) and query.isActive:
                if time.monotonic() - began > timeout_s:
                    break
        finally:
            query.stop()
    return sum(made)


class ViewJob:
    """Runs one generation of one view as a streaming query."""

    def __init__(
        self,
        spark: Any,
        view: View,
        kafka: KafkaConfig,
        options: JobOptions,
        *,
        generation: str | None = None,
        live: bool = True,
        hooks: CommitHooks | None = None,
        on_batch: Callable[[BatchReport], None] | None = None,
        log: Callable[[str], None] | None = None,
        on_phases: PhaseCallback | None = None,
    ) -> None:
        self.spark = spark
        self.view = view
        self.kafka = kafka
        self.options = options
        self.live = live
        self.generation = generation or view.store.live_generation()
        # Every store of the view, the primary last: it commits each batch last.
        self.writers: list[StoreWriter] = [
            store.writer(
                self.generation if store is view.store or not live else store.live_generation(),
                live=live,
                hooks=hooks,
            )
            for store in view.stores
        ]
        self.writer = self.writers[-1]
        self.dead_letters = DeadLetterQueue(kafka, view.name)
        # Lag tools see a live view as the consumer group tributary.view.<name>.
        self.lag = LagCommitter(kafka, view.name) if live else None
        self.on_batch = on_batch
        # Hears of each trigger's phases, Spark's own split (read when the next batch starts).
        self.on_phases = on_phases
        self._query: Any = None
        self._phased = -1  # the last batch whose phases were heard
        self.log = log or (lambda _line: None)
        self.reconciliation: Reconciliation | None = None
        self._committed: list[Offsets] = [{} for _ in self.writers]
        self._initial: Offsets = {}

    @property
    def checkpoint(self) -> Path:
        return checkpoint_dir(self.options.checkpoint_root, self.view.name, self.generation)

    def source_options(self, starting: str) -> dict[str, str]:
        opts = {
            "kafka.bootstrap.servers": self.kafka.bootstrap_servers,
            "subscribe": ",".join(self.view.topics),
            "startingOffsets": starting,
            "failOnDataLoss": str(self.options.fail_on_data_loss).lower(),
        }
        opts.update({f"kafka.{k}": v for k, v in self.kafka.extra.items()})
        if self.options.max_offsets_per_trigger is not None:
            opts["maxOffsetsPerTrigger"] = str(self.options.max_offsets_per_trigger)
        opts.update(self.view.options)
        opts.update(self.options.extra_source_options)
        return opts

    def prune_checkpoints(self) -> list[Path]:
        """Remove checkpoints of retired generations (replaced by a replay) and all but the
        newest checkpoint moved aside by a reconciliation."""
        folder = self.checkpoint.parent
        if not folder.is_dir():
            return []
        in_use = self.view.store.generations() | {self.generation}
        retired = [
            p
            for p in folder.iterdir()
            if p.is_dir() and ".reset-" not in p.name and p.name not in in_use
        ]
        resets = sorted(p for p in folder.iterdir() if ".reset-" in p.name)
        retired += resets[:-1]
        for path in retired:
            shutil.rmtree(path, ignore_errors=True)
        return retired

    def resume_offsets(self) -> Offsets:
        """Read the stores' ledgers: where the view resumes (per partition, the least offset
        any of its stores reached). A stateful view's checkpoint is checked against them."""
        commits = [w.committed() for w in self.writers]
        self._committed = [c.offsets for c in commits]
        resume = lowest(self._committed)
        self._initial = resume
        if self.view.stateful:
            self._check_state(commits)
        return resume

    def start(self, *, available_now: bool = False) -> Any:
        """Start the query at the store's offsets (``available_now``: read what is there now,
        then stop). A live job first removes checkpoints of retired generations: a replay leaves
        the old one in place because a job may still be running on it."""
        if self.live:
            self.prune_checkpoints()
        resume = self.resume_offsets()
        self.reconciliation = reconcile(self.checkpoint, resume, self.view.topics)
        if self.reconciliation.action == "reset":
            self.log(f"view {self.view.name}: {self.reconciliation.reason}")
        options = self.source_options(starting_offsets(resume))
        # Spark may replay batches of a kept checkpoint that the stores already have: their
        # records are dropped at the source, before the fold - unless the fold keeps state,
        # which the re-run batch must rebuild (the stores then skip its output).
        skip = {} if self.view.stateful else resume
        self._query = start_query(
            self._folded(options, skip),
            f"{self.view.name}.{self.generation}",
            self.view.output_mode,
            self.checkpoint,
            self.handle_batch,
            self.options.trigger_interval_s,
            available_now=available_now,
        )
        return self._query

    def _folded(self, options: dict[str, str], skip: Offsets) -> Any:
        """The view's streaming DataFrame: its topics read with ``options``, folded."""
        if isinstance(self.view.fold, PartitionFold):
            return folded_stream(self.spark, options, self.view.fold, skip)
        if self.view.decode is not None:
            decoded = folded_stream(self.spark, options, self.view.decode, skip)
            return self.view.fold(decoded)
        return self.view.fold(records_stream(self.spark, options, skip))

    def warm_up(self, records: int = WARM_UP_RECORDS, timeout_s: float = 120.0) -> int:
        """Run the view's read and fold over the first ``records`` of its topics and drop the
        result (no store is written; the checkpoint is thrown away). Spark's Python processes
        start and import the fold, so the first batch of the real query runs warm: a standby
        warms up before it waits for the lease. Returns the rows the fold made."""
        options = {**self.source_options("earliest"), "maxOffsetsPerTrigger": str(records)}
        return warm_up_query(
            self._folded(options, {}), self.view.name, self.view.output_mode, timeout_s
        )

    def _check_state(self, commits: list[Any]) -> None:
        """A stateful view's checkpoint holds its state: if it is gone (or disagrees with the
        stores) while the stores hold batches, resuming would start with empty state."""
        if not any(c.batches > 0 for c in commits):
            return
        decision = assess(self.checkpoint, lowest([c.offsets for c in commits]), self.view.topics)
        if decision.action != "kept":
            raise CheckpointLostError(
                f"view {self.view.name} keeps state in its checkpoint, and the checkpoint"
                f" cannot be used ({decision.reason}): it must be rebuilt from offset zero"
                f" (`tributary replay {self.view.name}`; `tributary run views` does it itself)"
            )

    def close(self) -> None:
        """Release the store writers' connections (the stores keep the data)."""
        for writer in self.writers:
            writer.close()
        if self.lag is not None:
            self.lag.close()

    def _range(self, batch_id: int) -> tuple[Offsets, Offsets]:
        return batch_range(self.checkpoint, batch_id, self._initial, f"view {self.view.name}")

    def handle_batch(self, batch: Any, batch_id: int) -> None:
        """foreachBatch body: check the range against the stores, fold, dead-letter, apply
        (errors through the JVM in brief: :func:`batch_errors_in_brief`)."""
        batch_errors_in_brief(self._handle_batch, f"view {self.view.name}")(batch, batch_id)

    def _handle_batch(self, batch: Any, batch_id: int) -> None:
        self._hear_phases()
        start, end = self._range(batch_id)
        if self.covered(end):
            if self.view.stateful:
                # The stores have its output, but Spark keeps the fold's state only when the
                # batch runs: run it (writing nothing) so the state moves to this batch.
                batch.write.format("noop").mode("overwrite").save()
            self.skipped(batch_id, start, end)
            return
        began = time.perf_counter()
        folded = batch.toArrow()
        self.apply_folded(batch_id, start, end, folded, time.perf_counter() - began)

    def covered(self, end: Offsets) -> bool:
        """Whether every store of the view holds the batch that ends at ``end``."""
        return all(covers(committed, end) for committed in self._committed)

    def skipped(self, batch_id: int, start: Offsets, end: Offsets) -> None:
        """The stores already hold the batch: report it, applied elsewhere."""
        self._applied(end)
        self._report(batch_id, start, end, 0, 0, False, 0.0, 0.0)

    def apply_folded(
        self, batch_id: int, start: Offsets, end: Offsets, folded: Any, fold_s: float
    ) -> None:
        """Apply a batch's folded rows (Arrow) to every store of the view, each atomically
        with its ledger (the primary last); dead letters go to ``dlq.<view>``."""
        for committed in self._committed:
            problems = gaps(committed, start)
            if problems:
                raise LedgerGapError(
                    f"view {self.view.name}: batch {batch_id} starts past a store"
                    f" ({'; '.join(problems)}); restart the job to resume from the stores"
                )
        began = time.perf_counter()
        writes, dead = split_folded(folded)
        fold_s += time.perf_counter() - began
        self.dead_letters.send(dead)
        refused: list[Rejected] = []

        def reject(items: Any) -> None:
            refused.extend(items)
            self.dead_letters.send(dead_letters_of(items, self.view.name))

        began = time.perf_counter()
        applied = self._apply_stores(Batch(batch_id, end, writes, start=start), reject)
        write_s = time.perf_counter() - began
        self._applied(end)
        self._report(
            batch_id,
            start,
            end,
            folded.num_rows,
            len(dead) + len(refused),
            applied,
            fold_s,
            write_s,
        )

    def _apply_stores(self, batch: Batch, reject: RejectHandler) -> bool:
        """Apply ``batch`` to every store that lacks it (a crash may have come between two
        stores). The other stores apply while the primary does, and the primary waits for
        them just before its commit: it still commits each batch last, and a store that fails
        leaves it uncommitted."""
        todo = [i for i, done in enumerate(self._committed) if not covers(done, batch.offsets)]
        primary = len(self.writers) - 1
        others = [i for i in todo if i != primary]
        if primary not in todo or not others:
            applied = False
            for index in todo:
                applied = self.writers[index].apply(batch, on_rejected=reject)
                self._stored(index, batch)
            return applied
        with ThreadPoolExecutor(len(others), thread_name_prefix="store") as pool:
            running = {i: pool.submit(self.writers[i].apply, batch, reject) for i in others}

            def gate() -> None:
                for future in running.values():
                    future.result()  # a failure here rolls the primary back

            try:
                applied = self.writers[primary].apply(batch, reject, gate)
            finally:
                wait(running.values())
        # A primary that had the batch already never reached the gate: the other stores'
        # failures are raised here then.
        for index, future in running.items():
            future.result()
            self._stored(index, batch)
        self._stored(primary, batch)
        return applied

    def _stored(self, index: int, batch: Batch) -> None:
        self._committed[index] = merge_offsets(self._committed[index], batch.offsets)

    def _hear_phases(self) -> None:
        """Hand the last finished trigger's phases to ``on_phases`` (once per batch)."""
        if self.on_phases is None or self._query is None:
            return
        try:
            self._phased, phases = trigger_phases(self._query.lastProgress, self._phased)
            if phases:
                self.on_phases(self.view.name, phases)
        except Exception as exc:  # metrics never stop a view
            self.log(f"view {self.view.name}: trigger phases not read: {exc}")

    def _applied(self, end: Offsets) -> None:
        """The stores hold the batch: show it to lag tools (never read back)."""
        if self.lag is not None:
            self.lag.commit(end)

    def _report(
        self,
        batch_id: int,
        start: Offsets,
        end: Offsets,
        folded: int,
        rejected: int,
        applied: bool,
        fold_s: float,
        write_s: float,
    ) -> None:
        if self.on_batch is not None:
            self.on_batch(
                BatchReport(
                    self.view.name,
                    self.generation,
                    batch_id,
                    span(start, end),
                    folded,
                    rejected,
                    applied,
                    end,
                    fold_s,
                    write_s,
                )
            )
