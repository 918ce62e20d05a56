"""``GET /metrics``: ``tributary serve``'s metrics in Prometheus' text format, written by
``prometheus-client`` (every name: :mod:`infra.telemetry`). Per view, read from its store at
every scrape:

- ``tributary_view_up`` (gauge): 1 when the view's store answered, else 0;
- ``tributary_view_batch_id`` (gauge): the last batch the view committed;
- ``tributary_view_<counter>``: each of the view's own counters (e.g. ``late_events`` of the
  analytics jobs), untyped so that the names stay as they are (a Prometheus counter's samples
  would have to end in ``_total``);

all labelled ``view``; then the overview's (lag in records and seconds, dead letters, verify),
the CDC slot's WAL against its budget, the commands run over HTTP, and the process's own.
"""

from collections.abc import Iterator, Sequence

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool

from infra.http_api.api import Api
from infra.settings import Settings
from infra.telemetry.cdc import SlotCollector
from infra.telemetry.commands import CommandMetrics
from infra.telemetry.endpoint import part_registry
from infra.telemetry.families import Family, Sample
from infra.telemetry.overview import Overview, OverviewCollector
from projections.view import View

__all__ = [
    "PROMETHEUS_TEXT",
    "ViewCollector",
    "add_metrics_route",
    "metrics_text",
    "serve_registry",
]

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
VIEW_UP = Family(
    "gauge", "tributary_view_up", "1 when the view's store answered, else 0.", ("view",)
)
VIEW_BATCH = Family(
    "gauge", "tributary_view_batch_id", "The last batch the view committed.", ("view",)
)


class ViewCollector(Collector):
    """A ``prometheus-client`` collector over views: their stores are read at each scrape."""

    def __init__(self, views: Sequence[View]) -> None:
        self.views = list(views)

    def collect(self) -> Iterator[Metric]:
        up: list[Sample] = []
        batch: list[Sample] = []
        own: dict[str, Metric] = {}
        for view in self.views:
            try:
                commit = view.store.committed(view.store.live_generation())
                counters = view.metrics() if view.metrics is not None else {}
            except Exception:  # a store that does not answer is a sample, not an error
                up.append(([view.name], 0))
                continue
            up.append(([view.name], 1))
            batch.append(([view.name], commit.batch_id))
            for name, value in counters.items():
                full = f"tributary_view_{name}"
                metric = own.setdefault(full, Metric(full, f"The view's {name}.", "unknown"))
                metric.add_sample(full, {"view": view.name}, value)
        yield VIEW_UP.of(*up)
        yield VIEW_BATCH.of(*batch)
        yield from own.values()


def metrics_text(views: Sequence[View]) -> str:
    """The views' samples in Prometheus' text format (0.0.4)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ViewCollector(views))
    return generate_latest(registry).decode()


def serve_registry(
    s: Settings, views: Sequence[View], overview: Overview
) -> tuple[CollectorRegistry, CommandMetrics]:
    """``serve``'s registry: the views, the overview, the CDC slot, the commands it runs (the
    returned :class:`CommandMetrics` counts them) and the process."""
    registry = part_registry()
    registry.register(ViewCollector(views))
    registry.register(OverviewCollector(overview))
    slot = s.debezium().slot_name

    def slot_now() -> object:
        from cdc.slots import slot_info

        return slot_info(s.postgres(), slot)

    registry.register(SlotCollector(slot, slot_now))
    return registry, CommandMetrics(registry, "http")


def add_metrics_route(app: FastAPI, api: Api) -> None:
    async def metrics() -> PlainTextResponse:
        text = await run_in_threadpool(generate_latest, api.metrics)
        return PlainTextResponse(text.decode(), media_type=PROMETHEUS_TEXT)

    app.add_api_route(
        "/metrics",
        metrics,
        methods=["GET"],
        summary="Metrics of the views, lag, dead letters, verify, CDC's slot and the commands"
        " (Prometheus text format)",
        description="tributary_view_up, tributary_view_batch_id, tributary_view_lag_records,"
        " tributary_view_lag_seconds, tributary_view_dead_letters and each view's own counters"
        " (e.g. tributary_view_late_events of the analytics jobs), labelled by view;"
        " tributary_verify_*, tributary_cdc_slot_*, tributary_commands_total and the"
        " process's own.",
        tags=["health"],
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {}}, "description": "The samples."}},
    )
