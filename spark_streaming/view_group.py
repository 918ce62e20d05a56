"""Views that fold per partition, run as one streaming query.

A query per view reads its topics once per view, and each query costs its own triggers, its
own offset and commit logs and its own Python read tasks: on a small machine the views' queries
queue behind each other, and every record waits for all of them. Views whose folds run per
partition (:class:`~projections.view.PartitionFold`) and keep no state in Spark can share one
query instead: it reads the union of their topics, each micro-batch reads the records once and folds
them for every member that reads their topic in the same read task
(:mod:`projections.together`), and the driver applies each member's rows to that member's
stores, each atomically with its own ledger over its own topics, exactly as its own query would.
The stores still hold the truth: the query starts each partition at the least offset any
member reading it reached, and a member ahead of the others folds only what its stores lack.

The members stay separate views everywhere else: each has its own generation, dead-letter
topic, lag group, metrics and replay (a replay runs the one view alone, and the shared query
restarts on the new generation). When one member fails (its store is down, it was rebuilt), the
whole query stops; :class:`~spark_streaming.runner.ViewRunner` then runs the failing member on
its own query, so it no longer holds the others back.
"""

import hashlib
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from connectors.errors import StaleGenerationError
from connectors.kafka import KafkaConfig
from projections.together import Member, rows_of, together
from projections.view import PartitionFold, View
from spark_streaming.checkpoint import Reconciliation, reconcile, starting_offsets
from spark_streaming.errors import StreamingError
from spark_streaming.progress import PhaseCallback, trigger_phases
from spark_streaming.stream import folded_stream
from spark_streaming.view_job import (
    WARM_UP_RECORDS,
    BatchReport,
    ViewJob,
    batch_errors_in_brief,
    batch_range,
    lowest,
    start_query,
    warm_up_query,
)
from tributary.view_model import Offsets
from tributary.view_store import CommitHooks
from views.catalog import JobOptions


def shareable(view: View) -> bool:
    """Whether a view can share a query: it folds per partition, in the source's read task,
    and keeps no state in Spark's checkpoint."""
    return (
        isinstance(view.fold, PartitionFold)
        and view.decode is None
        and not view.stateful
        and view.output_mode == "append"
    )


def shared(views: Sequence[View]) -> list[tuple[View, ...]]:
    """The views in groups that share a query: shareable views with the same source options,
    in the order given (any other view is a group of one)."""
    groups: dict[object, list[View]] = {}
    for view in views:
        key: object = tuple(sorted(view.options.items())) if shareable(view) else view.name
        groups.setdefault(key, []).append(view)
    return [tuple(group) for group in groups.values()]


NAME_CHARS = 120  # a longer folder name (many views) is cut and made unique by a digest


def folder_name(text: str) -> str:
    """``text`` as one folder name: kept when short, else its head and a digest of it."""
    if len(text) <= NAME_CHARS:
        return text
    return f"{text[:80]}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def only(offsets: Offsets, topics: Sequence[str]) -> Offsets:
    """The offsets of ``topics``."""
    return {topic: parts for topic, parts in offsets.items() if topic in topics}


def lowest_of_readers(resumes: Sequence[Offsets], topics: Sequence[Sequence[str]]) -> Offsets:
    """Per partition, the least offset that the members reading its topic reached (left out
    when one of them has not reached it at all: the partition starts at the earliest offset)."""
    out: Offsets = {}
    for topic in dict.fromkeys(t for ts in topics for t in ts):
        readers = [r for r, ts in zip(resumes, topics, strict=True) if topic in ts]
        out.update(lowest([{topic: r.get(topic, {})} for r in readers]))
    return {topic: parts for topic, parts in out.items() if parts}


class MemberFailedError(StreamingError):
    """One member of a shared query could not be opened (its store is unreachable, say)."""

    def __init__(self, view: str, cause: BaseException) -> None:
        super().__init__(f"view {view}: {type(cause).__name__}: {cause}")
        self.view = view


class ViewGroupJob:
    """Runs the live generations of several views as one streaming query (see the module)."""

    def __init__(
        self,
        spark: Any,
        views: Sequence[View],
        kafka: KafkaConfig,
        options: JobOptions,
        *,
        hooks: CommitHooks | None = None,
        on_batch: Callable[[BatchReport], None] | None = None,
        log: Callable[[str], None] | None = None,
        on_phases: PhaseCallback | None = None,
    ) -> None:
        if len(views) < 2 or not all(shareable(v) for v in views):
            raise StreamingError("a shared query needs two or more views that fold per partition")
        if len(shared(views)) != 1:
            raise StreamingError("views share a query only with the same Kafka source options")
        self.spark = spark
        self.options = options
        self.names = [view.name for view in views]
        self.failing: str | None = None  # the member that failed the job, if one did
        self.log = log or (lambda _line: None)
        self.on_phases = on_phases
        self.members: list[ViewJob] = []
        self._opened = False
        for view in views:
            with self._member(view.name):
                self.members.append(
                    ViewJob(spark, view, kafka, options, hooks=hooks, on_batch=on_batch, log=log)
                )
        self._opened = True
        self.name = "+".join(self.names)
        self.generation = "+".join(m.generation for m in self.members)
        self.topics = tuple(dict.fromkeys(t for view in views for t in view.topics))
        self.reconciliation: Reconciliation | None = None
        self._query: Any = None
        self._phased = -1
        self._initial: Offsets = {}

    @contextmanager
    def _member(self, view: str) -> Iterator[None]:
        """Work of one member: an error other than a swapped generation names it as failing
        (and a member that cannot even be opened fails the job with
        :class:`MemberFailedError`)."""
        try:
            yield
        except StaleGenerationError:
            raise  # the member was rebuilt: the query restarts on its new generation
        except Exception as exc:
            self.failing = view
            if not self._opened:
                for opened in self.members:
                    opened.close()
                raise MemberFailedError(view, exc) from exc
            raise

    @property
    def checkpoint(self) -> Path:
        return self.options.checkpoint_root / folder_name(self.name) / folder_name(self.generation)

    def prune_checkpoints(self) -> list[Path]:
        """Remove the group's checkpoints of other generations (a member was rebuilt) and all
        but the newest checkpoint moved aside by a reconciliation."""
        folder = self.checkpoint.parent
        if not folder.is_dir():
            return []
        paths = [p for p in folder.iterdir() if p.is_dir()]
        resets = sorted(p for p in paths if ".reset-" in p.name)
        retired = [p for p in paths if ".reset-" not in p.name and p != self.checkpoint]
        retired += resets[:-1]
        for path in retired:
            shutil.rmtree(path, ignore_errors=True)
        return retired

    def _source(
        self, starting: Offsets | str, resumes: Sequence[Offsets]
    ) -> tuple[dict[str, str], PartitionFold, Offsets]:
        """The shared query's source options, its fold of every member, and the offsets
        below which records are dropped at the source (those every member's stores hold)."""
        start = starting if isinstance(starting, str) else starting_offsets(starting)
        members = []
        for job, skip in zip(self.members, resumes, strict=True):
            assert isinstance(job.view.fold, PartitionFold)  # shareable() checked it
            members.append(Member(job.view.name, job.view.topics, job.view.fold, skip))
        skip_all = {} if isinstance(starting, str) else starting
        options = self.members[0].source_options(start)
        options["subscribe"] = ",".join(self.topics)
        return options, together(members), skip_all

    def start(self, *, available_now: bool = False) -> Any:
        """Start the shared query at the least offset any member's store reached."""
        self.prune_checkpoints()
        for member in self.members:  # a retired generation's checkpoints of the view alone
            member.prune_checkpoints()
        resumes = []
        for m in self.members:
            with self._member(m.view.name):
                resumes.append(only(m.resume_offsets(), m.view.topics))
        resume = lowest_of_readers(resumes, [m.view.topics for m in self.members])
        self._initial = resume
        self.reconciliation = reconcile(self.checkpoint, resume, self.topics)
        if self.reconciliation.action == "reset":
            self.log(f"views {self.name}: {self.reconciliation.reason}")
        options, fold, skip = self._source(resume, resumes)
        self._query = start_query(
            folded_stream(self.spark, options, fold, skip),
            f"{self.name}.{self.generation}",
            "append",
            self.checkpoint,
            self.handle_batch,
            self.options.trigger_interval_s,
            available_now=available_now,
        )
        return self._query

    def warm_up(self, records: int = WARM_UP_RECORDS, timeout_s: float = 120.0) -> int:
        """Fold the head of the topics for every member and drop it (see
        :meth:`ViewJob.warm_up`)."""
        options, fold, _ = self._source("earliest", [{} for _ in self.members])
        options["maxOffsetsPerTrigger"] = str(records)
        stream = folded_stream(self.spark, options, fold, {})
        return warm_up_query(stream, self.name, "append", timeout_s)

    def close(self) -> None:
        for member in self.members:
            member.close()

    def handle_batch(self, batch: Any, batch_id: int) -> None:
        batch_errors_in_brief(self._handle_batch, f"views {self.name}")(batch, batch_id)

    def _handle_batch(self, batch: Any, batch_id: int) -> None:
        self._hear_phases()
        start, end = batch_range(self.checkpoint, batch_id, self._initial, f"views {self.name}")
        pending = []
        for member in self.members:
            mine = only(start, member.view.topics), only(end, member.view.topics)
            if member.covered(mine[1]):
                member.skipped(batch_id, *mine)
            else:
                pending.append((member, mine))
        if not pending:
            return
        began = time.perf_counter()
        folded = batch.toArrow()
        fold_s = time.perf_counter() - began
        if len(pending) == 1:
            member, (first, last) = pending[0]
            with self._member(member.view.name):
                member.apply_folded(
                    batch_id, first, last, rows_of(folded, member.view.name), fold_s
                )
            return
        # Each member's stores apply at the same time (they share nothing); a failure is
        # raised for the first failing member in order, after every member has finished.
        with ThreadPoolExecutor(len(pending), thread_name_prefix="member") as pool:
            running = [
                pool.submit(
                    member.apply_folded,
                    batch_id,
                    first,
                    last,
                    rows_of(folded, member.view.name),
                    fold_s,
                )
                for member, (first, last) in pending
            ]
        for (member, _), future in zip(pending, running, strict=True):
            with self._member(member.view.name):
                future.result()

    def _hear_phases(self) -> None:
        """Each trigger's phases, heard once for every member (they share the trigger)."""
        if self.on_phases is None or self._query is None:
            return
        try:
            self._phased, phases = trigger_phases(self._query.lastProgress, self._phased)
            for member in self.members if phases else ():
                self.on_phases(member.view.name, phases)
        except Exception as exc:  # metrics never stop a view
            self.log(f"views {self.name}: trigger phases not read: {exc}")
