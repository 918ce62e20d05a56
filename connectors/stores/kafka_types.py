"""The Kafka store as its writer sees it.

:mod:`connectors.stores.kafka` makes a :class:`~connectors.stores.kafka_writer.KafkaWriter` per
generation, and the writer uses its store's names, clients and ledger: this :class:`Protocol`
says which, so both import this module and neither imports the other back. The records' and
the ledger's formats (headers, ledger records, range reads) are in
:mod:`connectors.stores.kafka_ledger`.
"""

import threading
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Protocol

from confluent_kafka import Producer

from connectors.stores.kafka_ledger import LedgerLog, RangeReader
from tributary.view_model import Commit
from tributary.view_store import Collection, Materializer


class WriterStore(Protocol):
    """What a Kafka writer uses of its :class:`~connectors.stores.kafka.KafkaStore`."""

    view: str
    materializer: Materializer | None
    collections: dict[str, Collection]
    partitions: int
    ledger_topic: str
    timeout: float  # seconds for one read, flush or admin call
    lock: "threading.RLock"  # the reading consumer, the ledger, the admin client

    def collection(self, name: str) -> Collection: ...

    def generation_topics(self, shadow: str | None) -> dict[str, str]: ...

    def errors(self, what: str) -> AbstractContextManager[None]: ...

    def ensure_topics(self, names: Iterable[str], partitions: int | None = None) -> None: ...

    def committed(self, generation: str) -> Commit: ...

    def ledger(self) -> LedgerLog: ...

    def current(self) -> LedgerLog:
        """The ledger read up to its end now (call under ``lock``)."""
        ...

    def reader(self) -> RangeReader:
        """The reader of every read (the ledger's: one per store object)."""
        ...

    def producer(self) -> Producer:
        """The store's idempotent producer, shared by its writers."""
        ...
