"""Running every configured view in one Spark driver: the views that fold per partition share
one query over their topics (:mod:`spark_streaming.view_group`), every other view has its own.
A query that fails (for instance after a replay swapped in a new generation) is restarted with
backoff, and the member that failed a shared query leaves it for a query of its own. All stop
cleanly when asked."""

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from connectors.kafka import KafkaConfig
from connectors.leases import LeaseHeldError
from projections.view import View
from spark_streaming.errors import CheckpointLostError
from spark_streaming.progress import PhaseCallback
from spark_streaming.replay import replay
from spark_streaming.view_group import MemberFailedError, ViewGroupJob, shared
from spark_streaming.view_job import BatchReport, ViewJob
from tributary.backoff import Backoff
from views.catalog import JobOptions


@dataclass
class _Running:
    specs: tuple[View, ...]  # one view, or views that share a query
    job: ViewJob | ViewGroupJob | None = None
    query: Any = None
    backoff: Backoff = field(default_factory=Backoff)
    restart_at: float = 0.0
    started_at: float = 0.0
    standby: bool = False  # another process holds a view's lease: take over when it dies

    @property
    def name(self) -> str:
        return "+".join(spec.name for spec in self.specs)


class ViewRunner:
    """Keeps the views' streaming queries alive until :meth:`run`'s ``stop`` is set
    (``share``: the views that fold per partition share a query)."""

    def __init__(
        self,
        spark: Any,
        specs: Sequence[View],
        kafka: KafkaConfig,
        options: JobOptions,
        *,
        log: Callable[[str], None] = print,
        min_backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        replay_options: JobOptions | None = None,
        lease_for: Callable[[str], Any] | None = None,
        standby_poll_s: float = 0.25,
        on_batch: Callable[[BatchReport], None] | None = None,
        standby: bool = False,
        on_phases: PhaseCallback | None = None,
        share: bool = True,
    ) -> None:
        self.spark = spark
        self.kafka = kafka
        self.options = options
        self.log = log
        self.replay_options = replay_options or options
        # The lease a view holds while its query runs (e.g. connectors.leases.Lease): a view
        # never runs twice, whatever starts a second copy.
        self.lease_for = lease_for
        self.standby_poll_s = standby_poll_s
        # Hears of every micro-batch of every view (e.g. the process's metrics).
        self.on_batch = on_batch
        # Hears of each trigger's phases (Spark's split: spark_streaming.progress).
        self.on_phases = on_phases
        # A standby process (`tributary run views-standby`) takes a view's lease only after
        # another process held it: started beside the primary, it never wins the race to it.
        self.standby = standby
        self._leases: dict[str, Any] = {}
        self._waiting: dict[str, Any] = {}  # leases another process holds, tried again
        self._backoff = (min_backoff_s, max_backoff_s)
        groups = shared(specs) if share else [(spec,) for spec in specs]
        self.views = [self._running(group) for group in groups]

    def _running(self, specs: tuple[View, ...]) -> _Running:
        low, high = self._backoff
        return _Running(specs, backoff=Backoff(initial_s=low, max_s=high))

    def _lease(self, view: _Running) -> bool:
        """Hold the leases of the query's views; False while another process holds one (this
        one stands by: the database frees a lease the moment its holder dies, and the next
        poll takes it). Leases taken before one that is held are given back, so two processes
        never each hold part of a shared query's views."""
        if self.lease_for is None:
            return True
        taken: list[str] = []
        for name in (spec.name for spec in view.specs):
            if name in self._leases:
                continue
            was_standing_by = view.standby
            held = self._lease_one(view, name)
            if held is not None:
                for back in taken:
                    self._leases.pop(back).release()
                view.restart_at = time.monotonic() + self.standby_poll_s
                if view.standby and not was_standing_by:
                    for spec in view.specs:  # each view's operator sees it stand by
                        self.log(f"view {spec.name}: standing by ({held})")
                return False
            taken.append(name)
        if view.standby:
            self.log(f"view {view.name}: the lease is free, taking over")
            view.standby = False
        return True

    def _lease_one(self, view: _Running, name: str) -> str | None:
        """Take one view's lease: None when held, else who holds it (or why not yet)."""
        assert self.lease_for is not None
        lease = self._waiting.pop(name, None) or self.lease_for(f"view:{name}")
        why = "another process holds it"
        if view.standby:
            if lease.try_acquire():
                self._leases[name] = lease
                return None
        elif self.standby:
            why = "waiting for the primary to take it"
            if lease.held_elsewhere():
                why = lease.holder()
                view.standby = True
        else:
            try:
                self._leases[name] = lease.acquire()
                return None
            except LeaseHeldError as held:
                why = str(held)
                view.standby = True
        self._waiting[name] = lease
        return why

    def _start(self, view: _Running) -> None:
        view.started_at = 0.0
        try:
            if not self._lease(view):
                return
            view.job = self._job(view.specs)
            try:
                view.query = view.job.start()
            except CheckpointLostError as lost:  # a stateful view: never in a shared query
                view.job.close()
                [spec] = view.specs
                self.log(f"view {spec.name}: {lost}; rebuilding it from offset zero")
                # the live generation cannot go on: nothing to verify the rebuild against
                result = replay(self.spark, spec, self.kafka, self.replay_options, verify=False)
                self.log(
                    f"view {spec.name}: rebuilt generation {result.generation}"
                    f" ({result.records} records)"
                )
                view.job = self._job(view.specs)
                view.query = view.job.start()
            view.started_at = time.monotonic()
            self.log(f"view {view.name}: running generation {view.job.generation}")
        except Exception as exc:
            self._failed(view, exc)

    def _job(self, specs: tuple[View, ...]) -> ViewJob | ViewGroupJob:
        if len(specs) > 1:
            return ViewGroupJob(
                self.spark,
                specs,
                self.kafka,
                self.options,
                log=self.log,
                on_batch=self.on_batch,
                on_phases=self.on_phases,
            )
        return ViewJob(
            self.spark,
            specs[0],
            self.kafka,
            self.options,
            log=self.log,
            on_batch=self.on_batch,
            on_phases=self.on_phases,
        )

    def _failed(self, view: _Running, error: object) -> None:
        failing = view.job.failing if isinstance(view.job, ViewGroupJob) else None
        if isinstance(error, MemberFailedError):
            failing = error.view
        if view.job is not None:
            view.job.close()
        view.job, view.query = None, None
        up_for = time.monotonic() - view.started_at if view.started_at else 0.0
        delay = view.backoff.next_delay(up_for)
        view.restart_at = time.monotonic() + delay
        self.log(f"view {view.name}: stopped ({error}); restarting in {delay:.0f}s")
        if failing is not None and len(view.specs) > 1:
            # The member that failed runs on its own query from now on: the others go on.
            alone = next(spec for spec in view.specs if spec.name == failing)
            view.specs = tuple(spec for spec in view.specs if spec is not alone)
            view.backoff = self._running(view.specs).backoff
            view.restart_at = time.monotonic()
            split = self._running((alone,))
            split.restart_at = time.monotonic() + delay
            self.views.append(split)
            self.log(f"view {failing}: runs on its own query from now on")

    def warm_up(self, stop: threading.Event) -> None:
        """Fold the head of each view's topics once and drop it (:meth:`ViewJob.warm_up`): a
        standby does it before it waits, so its queries start warm when it takes over."""
        for view in self.views:
            if stop.is_set():
                return
            job: ViewJob | ViewGroupJob | None = None
            began = time.monotonic()
            try:
                job = self._job(view.specs)
                rows = job.warm_up()
                took = time.monotonic() - began
                self.log(f"view {view.name}: warmed up in {took:.1f}s ({rows} rows dropped)")
            except Exception as exc:  # a standby that cannot warm up still stands by
                self.log(f"view {view.name}: no warm-up ({exc}); standing by cold")
            finally:
                if job is not None:
                    job.close()

    def run(self, stop: threading.Event, poll_s: float = 0.25) -> None:
        """Run until ``stop`` is set; then stop every query and release the sinks. A standby
        warms its views up first."""
        if self.standby:
            self.warm_up(stop)
        for view in self.views:
            self._start(view)
        try:
            while not stop.wait(poll_s):
                for view in list(self.views):
                    if view.query is not None and not view.query.isActive:
                        self._failed(view, view.query.exception())
                    elif view.query is None and time.monotonic() >= view.restart_at:
                        self._start(view)
        finally:
            for view in self.views:
                if view.query is not None:
                    view.query.stop()
                if view.job is not None:
                    view.job.close()
            for lease in [*self._leases.values(), *self._waiting.values()]:
                lease.release()
            self.log("views stopped")
