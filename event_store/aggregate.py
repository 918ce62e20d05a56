"""Aggregates: a consistency boundary whose state is the fold of its events.

A subclass gives its initial state (a frozen dataclass) and ``evolve(state, event)``, the
pure fold. Its command methods check the current state, raise
:class:`~event_store.errors.CommandRejected` to refuse, and call :meth:`Aggregate.record`
to decide an event; recording applies the event at once, so later checks in the same
command see it. The bus appends the recorded events with the version the aggregate
was loaded at as the expected version.
"""

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar, Generic, TypeVar

from event_store.codec import adapter, to_json
from event_store.event import Event, JsonObject

S = TypeVar("S")


class Aggregate(ABC, Generic[S]):
    """Base of aggregates. ``stream_type`` names the stream family (and its Kafka topic)."""

    stream_type: ClassVar[str] = "aggregate"
    #: Bump when the state's shape changes: older snapshots are then ignored and replayed.
    snapshot_version: ClassVar[int] = 1

    def __init__(self, stream_id: str, state: S | None = None, version: int = 0) -> None:
        self.stream_id = stream_id
        self.state: S = self.initial_state() if state is None else state
        self.version = version
        self._pending: list[Event] = []

    @classmethod
    @abstractmethod
    def initial_state(cls) -> S:
        """The state of a stream with no events."""

    @classmethod
    @abstractmethod
    def evolve(cls, state: S, event: Event) -> S:
        """The state after ``event``: pure, no I/O, never rejects (events are facts)."""

    def record(self, event: Event) -> None:
        """Decide ``event``: apply it now and keep it for the append."""
        self.state = self.evolve(self.state, event)
        self._pending.append(event)

    def replay(self, events: Iterable[Event]) -> None:
        """Fold stored events into the state (each one is a version)."""
        for event in events:
            self.state = self.evolve(self.state, event)
            self.version += 1

    @property
    def pending(self) -> tuple[Event, ...]:
        """Events recorded since the load, not yet appended."""
        return tuple(self._pending)

    @property
    def exists(self) -> bool:
        """Whether the stream has any stored or recorded event."""
        return self.version > 0 or bool(self._pending)

    # -- snapshots ---------------------------------------------------------------------

    def snapshot_state(self) -> JsonObject:
        """The state as JSON (the state must be a dataclass or another pydantic-able type)."""
        return to_json(self.state)

    @classmethod
    def from_snapshot(cls, stream_id: str, version: int, state: JsonObject) -> "Aggregate[S]":
        """An aggregate at ``version`` with its state restored from :meth:`snapshot_state`."""
        state_type: type[Any] = type(cls.initial_state())
        return cls(stream_id, adapter(state_type).validate_python(state), version)
