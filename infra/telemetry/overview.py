"""The whole of a running Tributary as an operator sees it: the stack, the parts `tributary
run` supervises, the connector and its slot, the topics and their ends, each view's position,
lag (records and seconds), micro-batches and dead letters, and verify's last result.

Read from the sources themselves at each look (the stores' ledgers, the topics' true ends, the
files the supervisor, the connector and verify write, the views process's own metrics), so it
holds while any part is down. What ``tributary serve`` shows at ``/metrics``
(:class:`OverviewCollector`) and at ``/ui`` (:meth:`Overview.state`, with a history of the
last minutes kept by a sampler while the dashboard is open).
"""

import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from connectors.kafka.offsets import TrueEnds
from infra.telemetry.families import Family
from projections.view import View

if TYPE_CHECKING:
    from connectors.kafka import KafkaConfig, TopicInfo
    from infra.settings import Settings
    from views.status import ViewStatus

__all__ = ["Overview", "OverviewCollector", "ViewState"]

LOOK_TIMEOUT_S = 5.0  # a broker that does not answer makes a look fail fast, not hang a scrape

VIEW_LAG = Family(
    "gauge",
    "tributary_view_lag_records",
    "Records on the view's topics it has not applied (true ends minus its store's offsets).",
    ("view",),
)
VIEW_LAG_SECONDS = Family(
    "gauge",
    "tributary_view_lag_seconds",
    "How long the oldest record the view has not applied has been on its topic (0: caught up).",
    ("view",),
)
VIEW_DEAD_LETTERS = Family(
    "gauge",
    "tributary_view_dead_letters",
    "Records on the view's dead-letter topic dlq.<view>.",
    ("view",),
)
VIEW_REDRIVEN = Family(
    "gauge",
    "tributary_view_redriven_dead_letters",
    "Dead letters appended back to the view's topics by `tributary dlq redrive`.",
    ("view",),
)
VERIFY_OK = Family("gauge", "tributary_verify_ok", "1 when the last verify found nothing wrong.")
VERIFY_AT = Family(
    "gauge", "tributary_verify_last_run_timestamp_seconds", "When the last verify ran (Unix time)."
)
VERIFY_FINDINGS = Family(
    "gauge",
    "tributary_verify_findings",
    "What the last verify found, by kind (missing, stale, extra, ... records).",
    ("kind",),
)


@dataclass(frozen=True)
class ViewState:
    """One view now: its store's position, the lag behind its topics' true ends, and its
    dead letters."""

    status: "ViewStatus"
    lag_seconds: float | None  # 0 when caught up; None: not known (the record not fetched)
    dead_letters: int  # records on dlq.<view>
    redriven: int  # of them, appended back by `tributary dlq redrive`

    def as_dict(self) -> dict[str, Any]:
        st = self.status
        return {
            **st.as_dict(),
            "applied": sum(o for parts in st.offsets.values() for o in parts.values()),
            "lag_seconds": self.lag_seconds,
            "dead_letters": self.dead_letters,
            "redriven": self.redriven,
        }


def lag_refs(status: "ViewStatus") -> dict[tuple[str, int], int]:
    """Per partition the view is behind on, the first offset it has not applied."""
    refs = {}
    for topic, parts in status.ends.items():
        for partition, end in parts.items():
            applied = status.offsets.get(topic, {}).get(partition, 0)
            if end > applied:
                refs[(topic, int(partition))] = applied
    return refs


def lag_seconds(kafka: "KafkaConfig", status: "ViewStatus", now: float) -> float | None:
    """How long the oldest record the view has still to apply has been on its topic (the
    event time of the first unapplied record against now; the last applied record is the one
    before it); 0 when caught up."""
    from connectors.kafka.timestamps import record_times

    refs = lag_refs(status)
    if not refs:
        return 0.0
    times = record_times(kafka, refs)
    if not times:
        return None
    return max(0.0, now - min(times.values()))


def views_metrics(url: str, timeout_s: float = 1.0) -> dict[str, dict[str, float]]:
    """Per view, what a views process's ``/metrics`` says of its micro-batches ({} when it
    does not answer): ``batches``, ``records_in``, ``dead_letters``, ``last_fold_s``,
    ``last_write_s``, ``last_batch_at``."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(url, timeout=timeout_s).text
    except httpx.HTTPError:
        return {}
    out: dict[str, dict[str, float]] = {}
    names = {
        "tributary_view_batches_total": "batches",
        "tributary_view_records_in_total": "records_in",
        "tributary_view_dead_letters_total": "dead_letters",
        "tributary_view_last_batch_timestamp_seconds": "last_batch_at",
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            view = sample.labels.get("view")
            if view is None:
                continue
            mine = out.setdefault(view, {})
            if sample.name in names:
                key = names[sample.name]
                mine[key] = mine.get(key, 0.0) + sample.value
            elif sample.name == "tributary_view_last_batch_duration_seconds":
                mine[f"last_{sample.labels.get('stage')}_s"] = sample.value
    return out


@dataclass
class _Sample:
    at: float
    topic_ends: int
    applied: dict[str, int]
    lag: dict[str, int]
    lag_seconds: dict[str, float | None]
    batches: dict[str, float]


@dataclass
class _Look:
    at: float
    views: list[ViewState] = field(default_factory=list)
    topics: list["TopicInfo"] = field(default_factory=list)
    batches: dict[str, dict[str, float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


class Overview:
    """Looks at the running system, at most once per ``max_age_s`` (looks are shared by the
    metrics and the dashboard), and keeps a history of the last ``history_s`` seconds while
    the dashboard is open."""

    def __init__(
        self,
        s: "Settings",
        views: Sequence[View],
        *,
        max_age_s: float = 1.0,
        history_s: float = 600.0,
        step_s: float = 2.0,
        idle_after_s: float = 120.0,
    ) -> None:
        self.settings = s
        self.views = list(views)
        self.max_age_s = max_age_s
        self.step_s = step_s
        self.idle_after_s = idle_after_s
        self.history: deque[_Sample] = deque(maxlen=max(2, int(history_s / step_s)))
        self._look: _Look | None = None
        self._lock = threading.Lock()
        self._ends = TrueEnds()  # true ends remembered between looks (idle topics: no probe)
        self._policies: dict[str, str | None] = {}
        self._watched_at = 0.0
        self._sampler: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def kafka(self) -> "KafkaConfig":
        kafka = self.settings.kafka("tributary-overview")
        return replace(kafka, admin_timeout_s=min(kafka.admin_timeout_s, LOOK_TIMEOUT_S))

    # -- looking --------------------------------------------------------------------------

    def look(self) -> _Look:
        """The latest look, taken now when the last one is older than ``max_age_s``."""
        with self._lock:
            if self._look is None or time.time() - self._look.at > self.max_age_s:
                self._look = self._take()
                self._remember(self._look)
            return self._look

    def _take(self) -> _Look:
        from connectors.kafka import TopicAdmin
        from views.dead_letters import dlq_topic
        from views.status import view_statuses

        look = _Look(time.time())
        kafka = self.kafka
        try:
            look.topics = TopicAdmin(kafka).describe(known=self._ends, policies=self._policies)
        except Exception as exc:  # the broker is down: the look says so
            look.errors.append(f"kafka: {exc}")
        described = {t.name: t for t in look.topics}
        try:
            statuses = view_statuses(self.views, kafka, look.topics) if look.topics else []
        except Exception as exc:
            look.errors.append(f"views: {exc}")
            statuses = []
        redriven = self._redriven(look)
        for st in statuses:
            seconds: float | None = None
            try:
                seconds = lag_seconds(kafka, st, look.at) if st.error is None else None
            except Exception as exc:
                look.errors.append(f"lag of {st.view}: {exc}")
            dlq = described.get(dlq_topic(st.view))
            dead = 0 if dlq is None else dlq.records
            look.views.append(ViewState(st, seconds, dead, redriven.get(st.view, 0)))
        look.batches = self._batches()
        return look

    def _redriven(self, look: _Look) -> dict[str, int]:
        from views.redrive import RedriveLedger

        try:
            return RedriveLedger(self.settings.postgres().dsn, self.settings.views_schema).counts()
        except Exception as exc:
            look.errors.append(f"redrive ledger: {exc}")
            return {}

    def _batches(self) -> dict[str, dict[str, float]]:
        from infra.supervision import metrics_url

        out: dict[str, dict[str, float]] = {}
        for part in ("views", "views-standby"):
            url = metrics_url(self.settings, part)
            if url is None:
                continue
            for view, figures in views_metrics(url).items():
                out.setdefault(view, {}).update(figures)
        return out

    # -- history --------------------------------------------------------------------------

    def _remember(self, look: _Look) -> None:
        if self.history and look.at - self.history[-1].at < self.step_s * 0.5:
            return
        self.history.append(
            _Sample(
                look.at,
                sum(t.records for t in look.topics if not t.name.startswith("_")),
                {v.status.view: int(v.as_dict()["applied"]) for v in look.views},
                {v.status.view: v.status.lag for v in look.views},
                {v.status.view: v.lag_seconds for v in look.views},
                {view: b.get("batches", 0.0) for view, b in look.batches.items()},
            )
        )

    def watch(self) -> None:
        """The dashboard is open: keep sampling (every ``step_s``) until it has not asked for
        ``idle_after_s``."""
        self._watched_at = time.monotonic()
        if self._sampler is None or not self._sampler.is_alive():
            self._sampler = threading.Thread(target=self._sample, name="overview", daemon=True)
            self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.step_s):
            if time.monotonic() - self._watched_at > self.idle_after_s:
                return
            try:
                self.look()
            except Exception:  # a failed look is retried at the next step
                continue

    def close(self) -> None:
        self._stop.set()

    # -- what the dashboard shows -----------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything ``/ui`` shows, as JSON-ready data."""
        from infra.supervision import parts_file, read_state
        from infra.verify import read_last

        look = self.look()
        s = self.settings
        return {
            "at": look.at,
            "stack": self._stack(),
            "parts": read_state(parts_file(s)),
            "cdc": self._cdc(),
            "topics": [
                {
                    "name": t.name,
                    "partitions": len(t.partitions),
                    "end_offsets": {str(p.partition): p.end_offset for p in t.partitions},
                    "records": t.records,
                    "cleanup_policy": t.cleanup_policy,
                }
                for t in look.topics
            ],
            "views": [self._view(v, look) for v in look.views],
            "verify": read_last(s),
            "history": self._history(),
            "errors": look.errors,
        }

    def _stack(self) -> list[dict[str, object]]:
        from infra.stack import LocalStack

        if not self.settings.uses_local_stack:
            return []
        try:
            return [c.as_dict() for c in LocalStack(self.settings).status()]
        except Exception as exc:
            return [{"name": "stack", "state": f"unknown ({exc})", "endpoint": "", "pid": None}]

    def _cdc(self) -> dict[str, object]:
        from infra.connector_state import cdc_status

        try:
            return cdc_status(self.settings)
        except Exception as exc:
            return {"name": self.settings.cdc_connector_name, "state": f"unknown ({exc})"}

    def _view(self, view: ViewState, look: _Look) -> dict[str, Any]:
        out = view.as_dict()
        batches = look.batches.get(view.status.view, {})
        out["batch"] = {
            "rate_per_min": self._batch_rate(view.status.view),
            "last_fold_s": batches.get("last_fold_s"),
            "last_write_s": batches.get("last_write_s"),
            "last_at": batches.get("last_batch_at"),
            "total": batches.get("batches"),
        }
        return out

    def _batch_rate(self, view: str) -> float | None:
        """Micro-batches a minute over the history's last minute (None: not known)."""
        points = [h for h in self.history if view in h.batches]
        if len(points) < 2:
            return None
        last = points[-1]
        first = next((h for h in points if last.at - h.at <= 60.0), points[0])
        if last.at - first.at <= 0:
            return None
        return (last.batches[view] - first.batches[view]) * 60.0 / (last.at - first.at)

    def _history(self) -> list[dict[str, Any]]:
        """Per sample: records/s into the topics and applied by the views, and each view's
        lag (records and seconds)."""
        out = []
        previous: _Sample | None = None
        for h in self.history:
            point: dict[str, Any] = {
                "at": h.at,
                "lag": h.lag,
                "lag_seconds": h.lag_seconds,
                "in_per_s": None,
                "applied_per_s": None,
            }
            if previous is not None and h.at > previous.at:
                dt = h.at - previous.at
                point["in_per_s"] = max(0, h.topic_ends - previous.topic_ends) / dt
                point["applied_per_s"] = (
                    sum(max(0, n - previous.applied.get(view, n)) for view, n in h.applied.items())
                    / dt
                )
            out.append(point)
            previous = h
        return out


class OverviewCollector(Collector):
    """What ``tributary serve``'s ``/metrics`` adds from the overview: per view its lag in
    records and seconds and its dead letters; verify's last result."""

    def __init__(self, overview: Overview) -> None:
        self.overview = overview

    def collect(self) -> Iterator[Metric]:
        from infra.verify import read_last

        try:
            look = self.overview.look()
        except Exception:
            look = None
        if look is not None:
            yield from self._views(look.views)
        yield from verify_metrics(read_last(self.overview.settings))

    @staticmethod
    def _views(views: list[ViewState]) -> Iterator[Metric]:
        yield VIEW_LAG.of(*(([v.status.view], v.status.lag) for v in views))
        yield VIEW_LAG_SECONDS.of(
            *(([v.status.view], v.lag_seconds) for v in views if v.lag_seconds is not None)
        )
        yield VIEW_DEAD_LETTERS.of(*(([v.status.view], v.dead_letters) for v in views))
        yield VIEW_REDRIVEN.of(*(([v.status.view], v.redriven) for v in views))


VERIFY_KINDS = (
    "table_missing",
    "table_stale",
    "table_extra",
    "events_missing",
    "events_unknown",
    "events_duplicated",
    "view_differences",
    "errors",
)


def verify_findings(result: dict[str, Any]) -> dict[str, int]:
    """What a verify result found, counted by kind."""
    tables = result.get("tables") or []
    events = result.get("events") or {}
    views = result.get("views") or {}
    return {
        "table_missing": sum(int(t.get("missing", 0)) for t in tables),
        "table_stale": sum(int(t.get("stale", 0)) for t in tables),
        "table_extra": sum(int(t.get("extra", 0)) for t in tables),
        "events_missing": int(events.get("missing", 0)),
        "events_unknown": int(events.get("unknown", 0)),
        "events_duplicated": int(events.get("duplicated", 0)),
        "view_differences": sum(len(v.get("differences") or []) for v in views.values()),
        "errors": len(result.get("errors") or []),
    }


def verify_metrics(result: dict[str, Any] | None) -> Iterator[Metric]:
    """``tributary_verify_ok``, ``…_last_run_timestamp_seconds`` and ``…_findings{kind}`` of
    the last verify (nothing before the first)."""
    if result is None:
        return
    yield VERIFY_OK.of(([], 1 if result.get("ok") else 0))
    yield VERIFY_AT.of(([], float(result.get("at", 0))))
    yield VERIFY_FINDINGS.of(*(([kind], n) for kind, n in verify_findings(result).items()))
