"""A part's own ``GET /metrics``: ``prometheus-client``'s HTTP server on a port from the
settings, in a daemon thread of the part's process."""

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, disable_created_metrics
from prometheus_client.exposition import start_http_server
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

if TYPE_CHECKING:
    from infra.settings import Settings

__all__ = ["MetricsEndpoint", "part_registry", "serve_metrics", "serve_part_metrics"]

log = logging.getLogger(__name__)


def part_registry() -> CollectorRegistry:
    """A registry with what every process shows (``process_*``, ``python_*``). The client's
    ``*_created`` series (a gauge per counter and histogram in the text format) are turned off,
    for the whole process: Prometheus does not use them and they double the series."""
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry(auto_describe=False)  # collectors read at scrapes only
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


@dataclass
class MetricsEndpoint:
    """A running metrics server: where it answers, and how to stop it."""

    host: str
    port: int
    server: Any
    thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_metrics(
    registry: CollectorRegistry, host: str, port: int, part: str
) -> MetricsEndpoint | None:
    """Serve ``registry`` at ``http://host:port/metrics`` (port 0: not served). A port that is
    taken is logged and the part goes on without its endpoint: its work matters more than its
    metrics."""
    if port <= 0:
        return None
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        log.warning(
            "%s: metrics not served on %s:%d (%s): choose another port in the settings",
            part,
            host,
            port,
            exc.strerror or exc,
        )
        return None
    return MetricsEndpoint(host, int(server.server_address[1]), server, thread)


def serve_part_metrics(
    s: "Settings", part: str, registry: CollectorRegistry, port: int | None = None
) -> MetricsEndpoint | None:
    """Serve a part's metrics on ``port`` (default: the part's port from the settings)."""
    chosen = s.metrics_port(part) if port is None else port
    return serve_metrics(registry, s.metrics_host, chosen, part)
