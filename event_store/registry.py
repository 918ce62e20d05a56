"""The command handler registry: which aggregate and stream a command goes to, and who decides.

::

    registry = CommandRegistry(EventCodec(EventRegistry([PostCreated, ...])))

    @registry.handler(CreatePost, Post, stream=lambda c: f"post-{c.post_id}")
    def create_post(post: Post, command: CreatePost, ctx: HandlerContext) -> None:
        post.create(command.author_id, command.text, ctx.now)
"""

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import ValidationError

from event_store.aggregate import Aggregate
from event_store.codec import EventCodec, adapter
from event_store.command import Command
from event_store.errors import (
    CommandDecodeError,
    EventStoreError,
    StorageError,
    UnknownCommandTypeError,
)
from event_store.event import EventRegistry

if TYPE_CHECKING:
    from sqlalchemy import Connection

C = TypeVar("C", bound=Command)
A = TypeVar("A", bound=Aggregate[Any])


@dataclass(frozen=True)
class HandlerContext:
    """What a handler may use besides the aggregate.

    ``connection`` is the command's own transaction: reads through it (a CRUD table, say)
    happen in the same transaction as the append. :meth:`query_one` reads in the same
    transaction on the driver directly, for checks a handler runs on every command.
    ``reads`` holds the first row (or None) of each read the route declared
    (:class:`Read`): they ran in the same transaction, in the load's round trip.
    """

    command_id: str
    now: datetime
    connection: "Connection"
    reads: Mapping[str, tuple[Any, ...] | None] = field(default_factory=dict)

    def query_one(
        self, sql: str, params: Mapping[str, Any] | None = None
    ) -> tuple[Any, ...] | None:
        """The first row of ``sql`` in the command's transaction, or None.

        ``%(name)s`` parameters, sent as text and typed by the statement (cast where its
        context does not tell, ``%(id)s::bigint``); prepared once per connection and run on
        libpq directly (:mod:`event_store.prepared`): for checks a handler runs on every
        command, a SQLAlchemy Core statement costs several times the client CPU of the
        database round trip itself.
        """
        # Imported here: a registry that only routes commands (`tributary command`) does
        # without the driver.
        import psycopg

        from event_store import prepared

        driver = self.connection.connection.driver_connection
        if not isinstance(driver, psycopg.Connection):
            raise EventStoreError("query_one needs the psycopg 3 driver")
        try:
            [result] = prepared.run(driver, (prepared.Statement.of(sql), params or {}))
        except psycopg.Error as exc:
            raise StorageError(f"handler query failed: {exc}", exc.sqlstate) from exc
        return prepared.first_row(driver, result)


Handle = Callable[[A, C, HandlerContext], None]


@dataclass(frozen=True)
class Read:
    """A read a handler needs, declared with its route so the bus sends it together with
    the load (one round trip for both): ``sql`` with ``%(name)s`` parameters, as for
    :meth:`HandlerContext.query_one`; the handler finds its first row (or None) in
    ``ctx.reads[name]``."""

    sql: str
    params: Mapping[str, Any]


Reads = Callable[[C], Mapping[str, Read]]


@dataclass(frozen=True)
class Route(Generic[C, A]):
    """How one command type is handled."""

    command_type: type[C]
    aggregate_type: type[A]
    stream_id: Callable[[C], str]
    handle: Handle[A, C]
    reads: "Reads[C] | None" = None


class CommandRegistry:
    """Command types by name, each with its aggregate type, stream id and handler."""

    def __init__(self, codec: EventCodec | None = None) -> None:
        self.codec = codec or EventCodec(EventRegistry())
        self._routes: dict[str, Route[Any, Any]] = {}

    def register(
        self,
        command_type: type[C],
        aggregate_type: type[A],
        stream: Callable[[C], str],
        handle: Handle[A, C],
        reads: "Reads[C] | None" = None,
    ) -> None:
        """Route ``command_type`` to ``handle`` on the aggregate's stream ``stream(command)``;
        ``reads(command)`` names the reads the handler needs (see :class:`Read`)."""
        name = command_type.command_name
        if name in self._routes:
            raise ValueError(f"command type {name} already has a handler")
        self._routes[name] = Route(command_type, aggregate_type, stream, handle, reads)

    def handler(
        self,
        command_type: type[C],
        aggregate_type: type[A],
        stream: Callable[[C], str],
        reads: "Reads[C] | None" = None,
    ) -> Callable[[Handle[A, C]], Handle[A, C]]:
        """Decorator form of :meth:`register`."""

        def decorate(handle: Handle[A, C]) -> Handle[A, C]:
            self.register(command_type, aggregate_type, stream, handle, reads)
            return handle

        return decorate

    def route(self, command: Command) -> Route[Any, Any]:
        route = self._routes.get(command.command_name)
        if route is None or not isinstance(command, route.command_type):
            raise UnknownCommandTypeError(
                f"no handler for command type {command.command_name}; known: {self.names()}"
            )
        return route

    def names(self) -> list[str]:
        return sorted(self._routes)

    def decode(self, type_name: object, data: object) -> Command:
        """A command from its wire form (type name + JSON object), validated strictly."""
        if not isinstance(type_name, str):
            raise CommandDecodeError(f"command type must be a string, got {type_name!r}")
        route = self._routes.get(type_name)
        if route is None:
            raise UnknownCommandTypeError(
                f"unknown command type {type_name!r}; known: {', '.join(self.names())}"
            )
        if not isinstance(data, dict):
            raise CommandDecodeError(f"{type_name}: data must be a JSON object, got {data!r}")
        unknown = sorted(set(data) - {f.name for f in fields(route.command_type)})
        if unknown:
            raise CommandDecodeError(f"{type_name}: unknown fields {', '.join(map(str, unknown))}")
        try:
            # JSON mode: strict types (no "5" for 5, no 1 for True), objects for dataclasses.
            command: Command = adapter(route.command_type).validate_json(
                json.dumps(data), strict=True
            )
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'data'}: {err['msg']}"
                for err in exc.errors()
            )
            raise CommandDecodeError(f"{type_name}: {problems}") from exc
        return command
