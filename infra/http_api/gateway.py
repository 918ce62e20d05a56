"""The command side of the API: commands run through the command bus, the database prepared
on the first command as the processor does."""

import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine

from event_store import CommandBus, CommandRegistry, Rejected
from event_store.command import CommandResult
from event_store.command_wire import CommandEnvelope
from event_store.errors import ConcurrencyError, EventStoreError, StorageError
from event_store.outcomes import CommandObserver, CommandOutcome, Outcome
from infra.settings import Settings

__all__ = ["CommandGateway"]


class CommandGateway:
    """Runs commands through the bus; the database is prepared (schema, the domain's tables)
    on the first command, as the processor does, and again after a failure. ``observer``
    hears of every command the bus ran (entry ``http``)."""

    def __init__(
        self,
        settings: Settings,
        bus: CommandBus | None,
        observer: CommandObserver | None = None,
    ) -> None:
        self.observer = observer
        self._prepare: Callable[[], None] | None = None
        if bus is None:
            from connectors.postgres import make_engine
            from infra.commands import (
                command_bus,
                load_registry,
                prepare_database,
                register_schemas,
            )

            registry, module = load_registry(settings.command_handlers)
            engine = make_engine(settings.postgres())
            bus = command_bus(settings, engine, registry)

            def prepare() -> None:
                register_schemas(settings, registry)
                prepare_database(settings, engine, module)

            self._prepare = prepare
        self.bus = bus
        self._lock = threading.Lock()

    @property
    def registry(self) -> CommandRegistry:
        return self.bus.registry

    @property
    def engine(self) -> Engine:
        return self.bus.store.engine

    def handle(self, envelope: CommandEnvelope) -> CommandResult:
        """The command's result; raises the registry's decode errors for a command that does
        not fit its type, and the database's errors when it fails."""
        command = self.registry.decode(envelope.type, envelope.data)
        with self._lock:
            if self._prepare is not None:
                self._prepare()
                self._prepare = None
        # Data the database refuses (a NUL character, an integer beyond bigint) and a
        # handler's exception come back from the bus as the command's recorded rejection,
        # as the processor answers them (event_store.faults); a StorageError is the
        # database failing (503).
        began, conflicts = time.perf_counter(), self._conflicts()
        result, outcome = self._send(command, envelope)
        if self.observer is not None:
            took = time.perf_counter() - began
            # bus.conflicts counts every request's conflicts: under concurrent requests
            # another's may fall in this window (a metric, not a ledger)
            self.observer(CommandOutcome("http", outcome, took, self._conflicts() - conflicts))
        return result

    def _conflicts(self) -> int:
        return int(getattr(self.bus, "conflicts", 0))

    def _send(self, command: Any, envelope: CommandEnvelope) -> tuple[CommandResult, Outcome]:
        try:
            result = self.bus.send(command, envelope.command_id)
        except ConcurrencyError as exc:
            return Rejected(envelope.command_id, f"gave up after retries: {exc}"), "conflicting"
        except StorageError:
            raise
        except EventStoreError as exc:  # as the processor answers it
            return Rejected(envelope.command_id, str(exc)), "rejected"
        return result, "rejected" if isinstance(result, Rejected) else "accepted"
