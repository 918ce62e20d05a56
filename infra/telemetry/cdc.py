"""Metrics of change data capture: the running connector's counters (read from its status at
each scrape, in the CDC process) and its replication slot's WAL against the budget (read from
PostgreSQL at each scrape, in the CDC process and in ``serve``: a slot holds WAL back most
when its connector is down)."""

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["ConnectorCollector", "SlotCollector"]


class ConnectorCollector(Collector):
    """The connector's own counters, from its in-process status
    (:class:`cdc.status.ConnectorStatus`)."""

    def __init__(self, name: str, status: Callable[[], Any]) -> None:
        self.name = name
        self.status = status

    def collect(self) -> Iterator[Metric]:
        st = self.status()
        labels = [self.name]
        up = GaugeMetricFamily(
            "tributary_cdc_up", "1 while the connector streams changes.", labels=["connector"]
        )
        up.add_metric(labels, 1 if st.state == "running" else 0)
        yield up
        events = CounterMetricFamily(
            "tributary_cdc_events",
            "Change events published to Kafka (acknowledged) since the connector started.",
            labels=["connector"],
        )
        events.add_metric(labels, st.records_published)
        yield events
        batches = CounterMetricFamily(
            "tributary_cdc_batches",
            "Batches the embedded engine handed over since the connector started.",
            labels=["connector"],
        )
        batches.add_metric(labels, st.batches)
        yield batches
        seconds = CounterMetricFamily(
            "tributary_cdc_handler_seconds",
            "Time of the connector's handler by stage: read (records out of the JVM, routed)"
            " and publish (produced until acknowledged).",
            labels=["connector", "stage"],
        )
        seconds.add_metric([self.name, "read"], st.read_seconds)
        seconds.add_metric([self.name, "publish"], st.publish_seconds)
        yield seconds
        if st.last_change_at is not None:
            last = GaugeMetricFamily(
                "tributary_cdc_last_change_timestamp_seconds",
                "When the connector last published a change (Unix time).",
                labels=["connector"],
            )
            last.add_metric(labels, st.last_change_at)
            yield last


class SlotCollector(Collector):
    """A replication slot's retained WAL against ``max_slot_wal_keep_size``; nothing when
    PostgreSQL does not answer or the slot does not exist (yet)."""

    def __init__(self, slot: str, info: Callable[[], Any]) -> None:
        self.slot = slot
        self.info = info

    def collect(self) -> Iterator[Metric]:
        try:
            info = self.info()
        except Exception:  # PostgreSQL down: no sample rather than a failed scrape
            return
        if info is None:
            return
        labels = [self.slot]
        if info.retained_wal_bytes is not None:
            retained = GaugeMetricFamily(
                "tributary_cdc_slot_retained_wal_bytes",
                "WAL the replication slot holds back.",
                labels=["slot"],
            )
            retained.add_metric(labels, info.retained_wal_bytes)
            yield retained
        if info.budget_bytes is not None:
            budget = GaugeMetricFamily(
                "tributary_cdc_slot_wal_budget_bytes",
                "The WAL a slot may hold back (max_slot_wal_keep_size).",
                labels=["slot"],
            )
            budget.add_metric(labels, info.budget_bytes)
            yield budget
        active = GaugeMetricFamily(
            "tributary_cdc_slot_active", "1 while a connector reads the slot.", labels=["slot"]
        )
        active.add_metric(labels, 1 if info.active else 0)
        yield active
