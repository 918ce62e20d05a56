"""A metric's declaration, written once: its kind, name, help and labels.

A :class:`Family` serves both ways the processes make metrics: :meth:`Family.declare` makes the
``prometheus-client`` metric a process updates as things happen (counters, gauges, histograms
in a registry), :meth:`Family.of` the samples a collector reads at each scrape.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["Family", "Sample"]

Sample = tuple[Sequence[str], float]  # the labels' values, the value


@dataclass(frozen=True)
class Family:
    """One metric: ``kind`` (counter, gauge or histogram), ``name`` (a counter's without
    ``_total``), ``documentation``, ``labels`` and a histogram's ``buckets``."""

    kind: Literal["counter", "gauge", "histogram"]
    name: str
    documentation: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    def counter(self, registry: CollectorRegistry) -> Counter:
        """The counter in ``registry``, to count things as they happen."""
        self._is("counter")
        return Counter(self.name, self.documentation, self.labels, registry=registry)

    def gauge(self, registry: CollectorRegistry) -> Gauge:
        """The gauge in ``registry``, to set as things happen."""
        self._is("gauge")
        return Gauge(self.name, self.documentation, self.labels, registry=registry)

    def histogram(self, registry: CollectorRegistry) -> Histogram:
        """The histogram in ``registry``, to observe things as they happen."""
        self._is("histogram")
        return Histogram(
            self.name, self.documentation, self.labels, buckets=self.buckets, registry=registry
        )

    def of(self, *samples: Sample) -> Metric:
        """The family with these samples, as a collector yields it at a scrape (counters and
        gauges)."""
        family: CounterMetricFamily | GaugeMetricFamily
        if self.kind == "counter":
            family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        else:
            self._is("gauge")
            family = GaugeMetricFamily(self.name, self.documentation, labels=self.labels)
        for values, value in samples:
            family.add_metric(values, value)
        return family

    def _is(self, kind: str) -> None:
        if self.kind != kind:
            raise ValueError(f"{self.name} is a {self.kind}, not a {kind}")
