"""The Python side of Debezium's ChangeConsumer: publish a batch, then let the engine commit."""

import time
from collections.abc import Callable
from typing import Any

from pydbzengine import BasePythonChangeHandler

from cdc.publisher import ChangePublisher
from cdc.routing import ChangeRouter
from cdc.status import ConnectorStatus


class PublishingHandler(BasePythonChangeHandler):
    """Routes each record to its topic and returns only after Kafka acknowledged the batch.

    pydbzengine marks the records processed (and the engine commits the LSN) only after this
    method returns; an exception stops the engine with nothing of the batch committed.
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

    def handleJsonBatch(self, records: list[Any]) -> None:  # the name pydbzengine calls
        started = time.perf_counter()
        outgoing = []
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
        routed = time.perf_counter()
        published = self._publisher.publish(outgoing)
        status = self._status
        status.read_seconds += routed - started
        status.publish_seconds += time.perf_counter() - routed
        status.record_seconds += self._publisher.record_seconds
        status.state = "running"
        status.batches += 1
        if published:
            status.records_published += published
            status.last_change_at = time.time()
            status.last_lsn = self._router.last_lsn
        self._on_batch(status)
