"""Event sourcing: commands, aggregates, an append-only PostgreSQL event store, a command bus.

The public surface, by concept:

- model: :class:`Event`, :class:`Command`, :class:`Aggregate`, :class:`EventRegistry`
- storage: :class:`EventStore`, :func:`create_schema`, :func:`grant_application_role`,
  :class:`Position`, :class:`RecordedEvent`, :class:`NewEvent`
- evolution: :class:`Upcasters`, :class:`EventCodec`, :class:`SnapshotPolicy`
- commands: :class:`CommandRegistry`, :class:`CommandBus`, :class:`Accepted`, :class:`Rejected`
- Kafka entry point: :mod:`event_store.command_topic`
- asyncio: :class:`event_store.aio.AsyncEventStore` (same statements, psycopg async pool)

The names are loaded on first use (PEP 562): a process that needs only the model (a command's
data class, a result) does not pay for the store's drivers.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from event_store.schema import (
        DEFAULT_SCHEMA,
        create_schema,
        drop_schema,
        grant_application_role,
    )
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

_HOMES = {
    "Aggregate": "event_store.aggregate",
    "CommandBus": "event_store.bus",
    "EventCodec": "event_store.codec",
    "Accepted": "event_store.command",
    "Command": "event_store.command",
    "CommandResult": "event_store.command",
    "Rejected": "event_store.command",
    "result_from_json": "event_store.command",
    "CommandDecodeError": "event_store.errors",
    "CommandRejected": "event_store.errors",
    "ConcurrencyError": "event_store.errors",
    "EventStoreError": "event_store.errors",
    "UnknownCommandTypeError": "event_store.errors",
    "Event": "event_store.event",
    "EventRegistry": "event_store.event",
    "NewEvent": "event_store.event",
    "Position": "event_store.event",
    "RecordedEvent": "event_store.event",
    "CommandRegistry": "event_store.registry",
    "HandlerContext": "event_store.registry",
    "Read": "event_store.registry",
    "DEFAULT_SCHEMA": "event_store.schema",
    "create_schema": "event_store.schema",
    "drop_schema": "event_store.schema",
    "grant_application_role": "event_store.schema",
    "SnapshotPolicy": "event_store.snapshots",
    "AppendResult": "event_store.store",
    "EventStore": "event_store.store",
    "Upcasters": "event_store.upcasting",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value
