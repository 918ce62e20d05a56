"""Upcasters: old event shapes become the current shape on read; history is never rewritten.

An upcaster maps one stored ``(type, schema version)`` to the next, possibly under a new
type name, so renaming an event is one registration::

    upcasters.register("PostPublished", 1, "PostCreated", 2, lambda d: {**d, "hashtags": []})

Reading applies upcasters one step at a time until no upcaster matches; the codec then
decodes the result with the registered class.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace

from event_store.event import JsonObject, RecordedEvent

Transform = Callable[[JsonObject], JsonObject]

MAX_STEPS = 100


@dataclass(frozen=True)
class Upcaster:
    """One step: ``(from_type, from_version)`` → ``(to_type, to_version)`` with a data transform."""

    from_type: str
    from_version: int
    to_type: str
    to_version: int
    transform: Transform


class Upcasters:
    """A chain of upcasters keyed by the stored type and schema version they accept."""

    def __init__(self) -> None:
        self._steps: dict[tuple[str, int], Upcaster] = {}
        self._types: frozenset[str] = frozenset()

    def register(
        self,
        from_type: str,
        from_version: int,
        to_type: str,
        to_version: int,
        transform: Transform | None = None,
    ) -> None:
        """Register one step; ``transform`` defaults to keeping the data (a pure rename)."""
        if (to_type, to_version) == (from_type, from_version):
            raise ValueError(f"upcaster {from_type} v{from_version} maps to itself")
        if to_type == from_type and to_version < from_version:
            raise ValueError(f"upcaster {from_type} v{from_version} goes backwards")
        key = (from_type, from_version)
        if key in self._steps:
            raise ValueError(f"{from_type} v{from_version} already has an upcaster")
        self._steps[key] = Upcaster(
            from_type, from_version, to_type, to_version, transform or (lambda d: d)
        )
        self._types = frozenset(t for t, _ in self._steps)

    @property
    def event_types(self) -> frozenset[str]:
        """The stored type names some upcaster accepts: events of other types are left as
        they are without a look (bulk reads test this first)."""
        return self._types

    def upcast(self, event: RecordedEvent) -> RecordedEvent:
        """The event in its newest known shape (unchanged when no upcaster applies)."""
        if (event.event_type, event.schema_version) not in self._steps:
            return event
        event_type, version, data = self.upcast_fields(
            event.event_type, event.schema_version, event.data
        )
        return replace(event, event_type=event_type, schema_version=version, data=data)

    def upcast_fields(
        self, event_type: str, schema_version: int, data: JsonObject, transform: bool = True
    ) -> tuple[str, int, JsonObject]:
        """Type, schema version and data in their newest known shape (``data`` is not
        modified: a transform gets a copy). ``transform=False``: only the type and version
        (the data is returned as given)."""
        for _ in range(MAX_STEPS):
            step = self._steps.get((event_type, schema_version))
            if step is None:
                return event_type, schema_version, data
            event_type, schema_version = step.to_type, step.to_version
            if transform:
                data = step.transform(dict(data))
        raise ValueError(f"upcasters loop on {event_type} v{schema_version}")

    def __len__(self) -> int:
        return len(self._steps)
