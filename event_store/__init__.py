"""Event sourcing: commands, aggregates, an append-only PostgreSQL event store, a command bus.

The public surface, by concept:

- model: :class:`Event`, :class:`Command`, :class:`Aggregate`, :class:`EventRegistry`
- storage: :class:`EventStore`, :func:`create_schema`, :func:`grant_application_role`,
  :class:`Position`, :class:`RecordedEvent`, :class:`NewEvent`
- evolution: :class:`Upcasters`, :class:`EventCodec`, :class:`SnapshotPolicy`
- commands: :class:`CommandRegistry`, :class:`CommandBus`, :class:`Accepted`, :class:`Rejected`
- Kafka entry point: :mod:`event_store.command_topic`
- asyncio: :class:`event_store.aio.AsyncEventStore` (same statements, psycopg async pool)
"""

from event_store.aggregate import Aggregate
from event_store.bus import CommandBus
from event_store.codec import EventCodec
from event_store.command import Accepted, Command, CommandResult, Rejected, result_from_json
from event_store.errors import (
    CommandDecodeError,
    CommandRejected,
    ConcurrencyError,
    EventStoreError,
    UnknownCommandTypeError,
)
from event_store.event import Event, EventRegistry, NewEvent, Position, RecordedEvent
from event_store.registry import CommandRegistry, HandlerContext, Read
from event_store.schema import DEFAULT_SCHEMA, create_schema, drop_schema, grant_application_role
from event_store.snapshots import SnapshotPolicy
from event_store.store import AppendResult, EventStore
from event_store.upcasting import Upcasters

__all__ = [
    "DEFAULT_SCHEMA",
    "Accepted",
    "Aggregate",
    "AppendResult",
    "Command",
    "CommandBus",
    "CommandDecodeError",
    "CommandRegistry",
    "CommandRejected",
    "CommandResult",
    "ConcurrencyError",
    "Event",
    "EventCodec",
    "EventRegistry",
    "EventStore",
    "EventStoreError",
    "HandlerContext",
    "NewEvent",
    "Position",
    "Read",
    "RecordedEvent",
    "Rejected",
    "SnapshotPolicy",
    "UnknownCommandTypeError",
    "Upcasters",
    "create_schema",
    "drop_schema",
    "grant_application_role",
    "result_from_json",
]
