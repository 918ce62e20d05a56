"""A metric declared once (:class:`infra.telemetry.families.Family`) makes the live metric of
its kind and the scrape-time family of its kind, and refuses to be made as another kind."""

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from infra.telemetry.families import Family

HITS = Family("counter", "test_hits", "Hits.", ("page",))
LEVEL = Family("gauge", "test_level", "Level.", ("tank",))
WAIT = Family("histogram", "test_wait_seconds", "Wait.", (), (0.1, 1.0))


def test_a_family_is_made_only_as_its_own_kind() -> None:
    registry = CollectorRegistry()
    HITS.counter(registry).labels("home").inc(2)
    LEVEL.gauge(registry).labels("a").set(3)
    WAIT.histogram(registry).observe(0.5)
    with pytest.raises(ValueError, match="test_hits is a counter, not a gauge"):
        HITS.gauge(CollectorRegistry())
    with pytest.raises(ValueError, match="test_hits is a counter, not a histogram"):
        HITS.histogram(CollectorRegistry())
    with pytest.raises(ValueError, match="test_level is a gauge, not a counter"):
        LEVEL.counter(CollectorRegistry())
    with pytest.raises(ValueError, match="test_wait_seconds is a histogram, not a gauge"):
        WAIT.of()
    text = generate_latest(registry).decode()
    assert 'test_hits_total{page="home"} 2.0' in text
    assert 'test_level{tank="a"} 3.0' in text
    assert 'test_wait_seconds_bucket{le="1.0"} 1.0' in text


def test_a_collectors_family_carries_its_samples_under_its_labels() -> None:
    class Scrape(Collector):
        def collect(self) -> Iterator[Metric]:
            yield HITS.of((["home"], 5), (["about"], 1))
            yield LEVEL.of()

    registry = CollectorRegistry()
    registry.register(Scrape())
    families = {
        f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())
    }
    hits = families["test_hits"]
    assert hits.type == "counter"
    assert {(s.labels["page"], s.value) for s in hits.samples if s.name == "test_hits_total"} == {
        ("home", 5.0),
        ("about", 1.0),
    }
    assert families["test_level"].type == "gauge"
    assert families["test_level"].samples == []
