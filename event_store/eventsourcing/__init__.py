"""A persistence module for the ``eventsourcing`` library on Tributary's event store.

An application written with the library (its aggregates, applications, process applications
and projections) runs on Tributary unchanged by selecting this module the library's way::

    PERSISTENCE_MODULE=event_store.eventsourcing
    POSTGRES_DSN=postgresql://app:secret@db:5432/tributary   # or POSTGRES_DBNAME/HOST/PORT/...
    POSTGRES_SCHEMA=event_store                               # the event store schema

Its events go into the event store's ``events`` table, the CDC outbox, so Debezium publishes them
to ``events.<stream_type>`` as it publishes Tributary's own: key = the aggregate id, the
untyped Avro envelope (``io.tributary.Event``, schema in the registry) with the event's state
as JSON ``data``; how names are derived is in :mod:`event_store.eventsourcing.naming`, what
is stored where in :mod:`event_store.eventsourcing.tables`. Notification ids are per
application, gap-free and never skipped (:mod:`event_store.eventsourcing.recorders`);
snapshots, tracking records and the library's transcoder, cipher and compressor work as with
the library's PostgreSQL module. The library's own test cases run against it
(``tests/integration/eventsourcing``).
"""

from event_store.eventsourcing.config import RecorderConfig
from event_store.eventsourcing.errors import EventsourcingSettingsError
from event_store.eventsourcing.factory import TributaryFactory
from event_store.eventsourcing.recorders import (
    NotificationSubscription,
    TributaryAggregateRecorder,
    TributaryApplicationRecorder,
    TributaryProcessRecorder,
    TributarySnapshotRecorder,
    TributaryTrackingRecorder,
)

#: The library's name for a persistence module's factory (``eventsourcing.postgres:Factory``).
Factory = TributaryFactory

__all__ = [
    "EventsourcingSettingsError",
    "Factory",
    "NotificationSubscription",
    "RecorderConfig",
    "TributaryAggregateRecorder",
    "TributaryApplicationRecorder",
    "TributaryFactory",
    "TributaryProcessRecorder",
    "TributarySnapshotRecorder",
    "TributaryTrackingRecorder",
]
