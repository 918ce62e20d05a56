"""Every metric a Tributary process exposes follows Prometheus' naming conventions, checked as
``promtool check metrics`` does (its lint rules), on the text each registry writes, read back
with the client's own parsers (the text format and OpenMetrics).

The registries are the real ones of each part, fed real reports: the views process's (a
:class:`~spark_streaming.view_job.BatchReport`), the command processor's and ``serve``'s (a
:class:`~event_store.outcomes.CommandOutcome` each), the CDC process's (the connector's status
and its slot), and ``serve``'s overview (views' lag, dead letters, verify's findings)."""

import re
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from cdc.slots import SlotInfo
from cdc.status import ConnectorStatus
from event_store.outcomes import CommandOutcome
from infra.http_api.metrics import ViewCollector
from infra.telemetry.batches import ViewBatchMetrics
from infra.telemetry.cdc import ConnectorCollector, SlotCollector
from infra.telemetry.commands import CommandMetrics
from infra.telemetry.endpoint import part_registry
from infra.telemetry.overview import OverviewCollector, ViewState, verify_metrics
from spark_streaming.view_job import BatchReport
from views.status import ViewStatus

SNAKE = re.compile(r"^[a-z_:][a-z0-9_:]*$")
LABEL = re.compile(r"^[a-z_][a-z0-9_]*$")
# promtool: "metric names should not contain abbreviated units"; "use base unit …"
NOT_BASE_UNITS = re.compile(
    r"_(ms|msec|msecs|millis|milliseconds|microseconds|us|ns|nanoseconds|sec|secs|minutes|"
    r"mins|hours|days|kb|kib|mb|mib|gb|gib|kilobytes|megabytes|gigabytes|percent)(_|$)"
)
TYPE_WORDS = re.compile(r"_(counter|gauge|histogram|summary|untyped)(_|$)")


def lint(text: str) -> list[str]:
    """Problems ``promtool check metrics`` would name in this exposition text."""
    problems: list[str] = []
    helps = dict(re.findall(r"^# HELP (\S+) ?(.*)$", text, re.M))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    for name, kind in types.items():
        if not helps.get(name, "").strip():
            problems.append(f"{name}: no help text")
        if not SNAKE.match(name):
            problems.append(f"{name}: metric names should be written in snake_case")
        if kind == "counter" and not name.endswith("_total"):
            problems.append(f'{name}: counter metrics should have "_total" suffix')
        if kind != "counter" and name.endswith("_total"):
            problems.append(f'{name}: non-counter metrics should not have "_total" suffix')
        if TYPE_WORDS.search(name):
            problems.append(f"{name}: metric names should not include the type")
        if NOT_BASE_UNITS.search(name):
            problems.append(f"{name}: use base units (seconds, bytes) without abbreviations")
        if name.startswith("tributary_") and kind == "histogram":
            unit = name.rsplit("_", 1)[-1]
            if unit not in ("seconds", "bytes", "records"):
                problems.append(f"{name}: a histogram's name should end with its unit")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for label in sample.labels:
                if not LABEL.match(label) or label.startswith("__"):
                    problems.append(f"{sample.name}: label {label!r} is not snake_case")
                if label in ("le", "quantile") and family.type not in ("histogram", "summary"):
                    problems.append(f"{sample.name}: label {label!r} is reserved")
        if family.type == "histogram":
            names = {s.name for s in family.samples}
            infinite = [s for s in family.samples if s.labels.get("le") == "+Inf"]
            if not {f"{family.name}_sum", f"{family.name}_count"} <= names or not infinite:
                problems.append(f"{family.name}: a histogram needs +Inf, _sum and _count")
    return problems


class Fixed(Collector):
    """A collector that yields what it is given (an overview without a running system)."""

    def __init__(self, *families: Iterator[Metric]) -> None:
        self.families = [m for family in families for m in family]

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def views_process() -> CollectorRegistry:
    registry = part_registry()
    metrics = ViewBatchMetrics(registry)
    offsets = {"cdc.public.users": {"0": 120}}
    mirror = "mirror.public.users"
    metrics.observe(BatchReport(mirror, "g1", 4, 120, 80, 2, True, offsets, 0.4, 0.1))
    metrics.observe(BatchReport("timeline", "g1", 5, 0, 0, 0, False, offsets, 0.0, 0.0))
    metrics.observe_phases(mirror, {"addBatch": 0.6, "latestOffset": 0.03, "triggerExecution": 0.8})
    return registry


def command_process(entry: str) -> CollectorRegistry:
    registry = part_registry()
    metrics = CommandMetrics(registry, entry)
    metrics.observe(CommandOutcome(entry, "accepted", 0.004, 0))
    metrics.observe(CommandOutcome(entry, "conflicting", 0.2, 6))
    metrics.observe(CommandOutcome(entry, "rejected", 0.001, 0))
    return registry


def cdc_process() -> CollectorRegistry:
    registry = part_registry()
    status = ConnectorStatus("tributary", "running", records_published=42, batches=3)
    status.last_change_at = 1_700_000_000.0
    registry.register(ConnectorCollector("tributary", lambda: status))
    slot = SlotInfo("tributary_tributary", True, 4096, "0/16B3748", "reserved", 2048 * 2**20)
    registry.register(SlotCollector("tributary_tributary", lambda: slot))
    return registry


def serve_overview() -> CollectorRegistry:
    registry = command_process("http")
    offsets, ends = {"cdc.public.users": {"0": 100}}, {"cdc.public.users": {"0": 130}}
    status = ViewStatus("mirror.public.users", "postgres", "g1", 4, 5, offsets, ends)
    states = [ViewState(status, 12.5, 3, 1)]
    verify = {
        "ok": False,
        "at": 1_700_000_000.0,
        "tables": [{"table": "public.users", "missing": 1, "stale": 0, "extra": 2}],
        "events": {"missing": 0, "unknown": 0, "duplicated": 4},
        "views": {"timeline": {"differences": ["timeline: 1 missing rows"], "lag": 0}},
        "errors": [],
    }
    registry.register(Fixed(OverviewCollector._views(states), verify_metrics(verify)))
    store: Any = SimpleNamespace(
        live_generation=lambda: "g1", committed=lambda generation: SimpleNamespace(batch_id=4)
    )
    view: Any = SimpleNamespace(name="search", store=store, metrics=lambda: {"late_events": 2})
    registry.register(ViewCollector([view]))
    return registry


REGISTRIES = {
    "views": views_process,
    "commands": lambda: command_process("topic"),
    "cdc": cdc_process,
    "serve": serve_overview,
}


@pytest.mark.parametrize("part", REGISTRIES)
def test_every_metric_follows_the_conventions(part: str) -> None:
    registry = REGISTRIES[part]()
    text = generate_latest(registry).decode()
    assert lint(text) == []
    ours = {f.name for f in text_string_to_metric_families(text) if f.name.startswith("tributary_")}
    assert ours, "the part exposes no metric of its own"
    # The same registry as OpenMetrics reads back with that parser too (it is stricter).
    families = {f.name for f in parse_om(generate_openmetrics(registry).decode())}
    assert ours <= families


def test_the_views_process_counts_records_batches_and_time_by_stage() -> None:
    text = generate_latest(views_process()).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    mirror = (("view", "mirror.public.users"),)
    assert samples[("tributary_view_records_in_total", mirror)] == 120
    assert samples[("tributary_view_rows_out_total", mirror)] == 80
    assert samples[("tributary_view_dead_letters_total", mirror)] == 2
    assert samples[("tributary_view_batches_total", (("applied", "false"), ("view", "timeline")))]
    stage = (("stage", "fold"), ("view", "mirror.public.users"))
    assert samples[("tributary_view_last_batch_duration_seconds", stage)] == 0.4
    assert samples[("tributary_view_batch_duration_seconds_count", stage)] == 1
    phase = (("phase", "addBatch"), ("view", "mirror.public.users"))
    assert samples[("tributary_view_trigger_phase_seconds_sum", phase)] == 0.6
    assert samples[("tributary_view_trigger_phase_seconds_count", phase)] == 1


def test_serve_shows_lag_dead_letters_and_verify_findings() -> None:
    text = generate_latest(serve_overview()).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    mirror = (("view", "mirror.public.users"),)
    assert samples[("tributary_view_lag_records", mirror)] == 30
    assert samples[("tributary_view_lag_seconds", mirror)] == 12.5
    assert samples[("tributary_view_dead_letters", mirror)] == 3
    assert samples[("tributary_verify_ok", ())] == 0
    assert samples[("tributary_verify_findings", (("kind", "table_extra"),))] == 2
    assert samples[("tributary_verify_findings", (("kind", "view_differences"),))] == 1
    assert samples[("tributary_commands_total", (("entry", "http"), ("outcome", "conflicting")))]
    assert samples[("tributary_command_conflicts_total", (("entry", "http"),))] == 6


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("# HELP x_total c\n# TYPE x_total gauge\nx_total 1\n", "non-counter"),
        ("# HELP latency_ms l\n# TYPE latency_ms gauge\nlatency_ms 1\n", "base units"),
        ("# TYPE requests counter\nrequests 1\n", "no help text"),
        ("# HELP fooBar f\n# TYPE fooBar gauge\nfooBar 1\n", "snake_case"),
        ('# HELP x x\n# TYPE x gauge\nx{le="1"} 1\n', "reserved"),
    ],
)
def test_the_lint_names_what_promtool_would(text: str, problem: str) -> None:
    assert any(problem in p for p in lint(text)), lint(text)
