"""The Python client for services: send a command and, if asked, wait until the views read it.

``TributaryClient(settings).send("CreatePost", {...}, wait_views=True)`` runs the command
through the :class:`~event_store.CommandBus` in this process (the registry the processor
serves, ``TRIBUTARY_COMMAND_HANDLERS``) and then waits until every configured view that reads
the command's topic has applied its events (:class:`ViewWaiter`); it raises
:class:`ViewsLaggingError` naming the views that did not in time. Thread-safe.
"""

import threading
import uuid
from collections.abc import Sequence
from typing import Any

from connectors.postgres import make_engine
from event_store import Accepted, CommandResult, Rejected
from event_store.errors import ConcurrencyError, EventStoreError, StorageError
from infra.commands import command_bus, load_registry, register_schemas
from infra.settings import Settings, load_settings
from infra.views import view_waiter
from projections.view import View
from views.read_your_writes import PositionToken, ViewsLaggingError, ViewWaiter

__all__ = ["TributaryClient", "ViewsLaggingError", "view_waiter"]


class TributaryClient:
    """Commands through the bus, and read-your-writes waits on the views."""

    def __init__(self, settings: Settings | None = None, views: Sequence[View] | None = None):
        self.settings = s = settings or load_settings()
        registry, _ = load_registry(s.command_handlers)
        register_schemas(s, registry)
        self._engine = make_engine(s.postgres())
        self.bus = command_bus(s, self._engine, registry)
        self._views = views
        self._waiter: ViewWaiter | None = None
        self._lock = threading.Lock()

    def send(
        self,
        command_type: str,
        data: dict[str, Any],
        command_id: str | None = None,
        wait_views: bool = False,
        timeout: float = 30.0,
    ) -> CommandResult:
        """Handle the command as the processor would (a command that does not decode, or is
        refused, is :class:`Rejected`); with ``wait_views``, return only once the views that
        read its topic applied it (else :class:`ViewsLaggingError` after ``timeout``)."""
        command_id = command_id or str(uuid.uuid4())
        try:
            result = self.bus.send(self.bus.registry.decode(command_type, data), command_id)
        except ConcurrencyError as exc:
            result = Rejected(command_id, f"gave up after retries: {exc}")
        except StorageError:
            raise  # the database failed, not the command
        except EventStoreError as exc:
            result = Rejected(command_id, str(exc))
        if wait_views and isinstance(result, Accepted):
            self.wait_for(result.position_token, timeout)
        return result

    def wait_for(self, token: PositionToken | str, timeout: float = 30.0) -> None:
        """Wait until every view reading the token's topic applied it."""
        self.waiter().wait(token, timeout)

    def waiter(self) -> ViewWaiter:
        with self._lock:
            if self._waiter is None:
                self._waiter = view_waiter(self.settings, self._views)
            return self._waiter

    def close(self) -> None:
        with self._lock:
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.close()
        self._engine.dispose()

    def __enter__(self) -> "TributaryClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
