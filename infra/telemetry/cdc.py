"""Metrics of change data capture: the running connector's counters (read from its status at
each scrape, in the CDC process) and its replication slot's WAL against the budget (read from
PostgreSQL at each scrape, in the CDC process and in ``serve``: a slot holds WAL back most
when its connector is down)."""

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from infra.telemetry.families import Family

__all__ = ["ConnectorCollector", "SlotCollector"]

CONNECTOR = ("connector",)
UP = Family("gauge", "tributary_cdc_up", "1 while the connector streams changes.", CONNECTOR)
EVENTS = Family(
    "counter",
    "tributary_cdc_events",
    "Change events published to Kafka (acknowledged) since the connector started.",
    CONNECTOR,
)
BATCHES = Family(
    "counter",
    "tributary_cdc_batches",
    "Batches the embedded engine handed over since the connector started.",
    CONNECTOR,
)
HANDLER_SECONDS = Family(
    "counter",
    "tributary_cdc_handler_seconds",
    "Time of the connector's handler by stage: read (records out of the JVM, routed)"
    " and publish (produced until acknowledged).",
    ("connector", "stage"),
)
LAST_CHANGE = Family(
    "gauge",
    "tributary_cdc_last_change_timestamp_seconds",
    "When the connector last published a change (Unix time).",
    CONNECTOR,
)
SLOT = ("slot",)
RETAINED_WAL = Family(
    "gauge", "tributary_cdc_slot_retained_wal_bytes", "WAL the replication slot holds back.", SLOT
)
WAL_BUDGET = Family(
    "gauge",
    "tributary_cdc_slot_wal_budget_bytes",
    "The WAL a slot may hold back (max_slot_wal_keep_size).",
    SLOT,
)
SLOT_ACTIVE = Family(
    "gauge", "tributary_cdc_slot_active", "1 while a connector reads the slot.", SLOT
)


class ConnectorCollector(Collector):
    """The connector's own counters, from its in-process status
    (:class:`cdc.status.ConnectorStatus`)."""

    def __init__(self, name: str, status: Callable[[], Any]) -> None:
        self.name = name
        self.status = status

    def collect(self) -> Iterator[Metric]:
        st = self.status()
        at = [self.name]
        yield UP.of((at, 1 if st.state == "running" else 0))
        yield EVENTS.of((at, st.records_published))
        yield BATCHES.of((at, st.batches))
        yield HANDLER_SECONDS.of(
            ([self.name, "read"], st.read_seconds), ([self.name, "publish"], st.publish_seconds)
        )
        if st.last_change_at is not None:
            yield LAST_CHANGE.of((at, st.last_change_at))


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
        at = [self.slot]
        if info.retained_wal_bytes is not None:
            yield RETAINED_WAL.of((at, info.retained_wal_bytes))
        if info.budget_bytes is not None:
            yield WAL_BUDGET.of((at, info.budget_bytes))
        yield SLOT_ACTIVE.of((at, 1 if info.active else 0))
