"""Running every configured view in one Spark driver: one query per view, restarted with
backoff when it fails (for instance after a replay swapped in a new generation), all stopped
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
from spark_streaming.view_job import BatchReport, JobOptions, ViewJob
from tributary.backoff import Backoff


@dataclass
class _Running:
    spec: View
    job: ViewJob | None = None
    query: Any = None
    backoff: Backoff = field(default_factory=Backoff)
    restart_at: float = 0.0
    started_at: float = 0.0
    standby: bool = False  # another process holds the view's lease: take over when it dies


class ViewRunner:
    """Keeps one streaming query per view alive until :meth:`run`'s ``stop`` is set."""

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
        self.views = [
            _Running(spec, backoff=Backoff(initial_s=min_backoff_s, max_s=max_backoff_s))
            for spec in specs
        ]

    def _lease(self, view: _Running) -> bool:
        """Hold the view's lease; False while another process holds it (this one stands by:
        the database frees the lease the moment the holder dies, and the next poll takes it)."""
        name = view.spec.name
        if self.lease_for is None or name in self._leases:
            return True
        if view.standby:
            if not self._waiting[name].try_acquire():
                view.restart_at = time.monotonic() + self.standby_poll_s
                return False
            self._leases[name] = self._waiting.pop(name)
        elif self.standby:
            lease = self._waiting.get(name) or self.lease_for(f"view:{name}")
            self._waiting[name] = lease
            view.restart_at = time.monotonic() + self.standby_poll_s
            if lease.held_elsewhere():
                self.log(f"view {name}: standing by ({lease.holder()})")
                view.standby = True
            return False
        else:
            lease = self.lease_for(f"view:{name}")
            try:
                self._leases[name] = lease.acquire()
            except LeaseHeldError as held:
                self.log(f"view {name}: standing by ({held})")
                self._waiting[name] = lease
                view.standby = True
                view.restart_at = time.monotonic() + self.standby_poll_s
                return False
        if view.standby:
            self.log(f"view {name}: the lease is free, taking over")
            view.standby = False
        return True

    def _start(self, view: _Running) -> None:
        view.started_at = 0.0
        try:
            if not self._lease(view):
                return
            view.job = self._job(view.spec)
            try:
                view.query = view.job.start()
            except CheckpointLostError as lost:
                view.job.close()
                self.log(f"view {view.spec.name}: {lost}; rebuilding it from offset zero")
                result = replay(self.spark, view.spec, self.kafka, self.replay_options)
                self.log(
                    f"view {view.spec.name}: rebuilt generation {result.generation}"
                    f" ({result.records} records)"
                )
                view.job = self._job(view.spec)
                view.query = view.job.start()
            view.started_at = time.monotonic()
            self.log(f"view {view.spec.name}: running generation {view.job.generation}")
        except Exception as exc:
            self._failed(view, exc)

    def _job(self, spec: View) -> ViewJob:
        return ViewJob(
            self.spark,
            spec,
            self.kafka,
            self.options,
            log=self.log,
            on_batch=self.on_batch,
            on_phases=self.on_phases,
        )

    def _failed(self, view: _Running, error: object) -> None:
        if view.job is not None:
            view.job.close()
        view.job, view.query = None, None
        up_for = time.monotonic() - view.started_at if view.started_at else 0.0
        delay = view.backoff.next_delay(up_for)
        view.restart_at = time.monotonic() + delay
        self.log(f"view {view.spec.name}: stopped ({error}); restarting in {delay:.0f}s")

    def warm_up(self, stop: threading.Event) -> None:
        """Fold the head of each view's topics once and drop it (:meth:`ViewJob.warm_up`): a
        standby does it before it waits, so its queries start warm when it takes over."""
        for view in self.views:
            if stop.is_set():
                return
            job = self._job(view.spec)
            began = time.monotonic()
            try:
                rows = job.warm_up()
                took = time.monotonic() - began
                self.log(f"view {view.spec.name}: warmed up in {took:.1f}s ({rows} rows dropped)")
            except Exception as exc:  # a standby that cannot warm up still stands by
                self.log(f"view {view.spec.name}: no warm-up ({exc}); standing by cold")
            finally:
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
                for view in self.views:
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
