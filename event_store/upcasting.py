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

    def upcast(self, event: RecordedEvent) -> RecordedEvent:
        """The event in its newest known shape (unchanged when no upcaster applies)."""
        for _ in range(MAX_STEPS):
            step = self._steps.get((event.event_type, event.schema_version))
            if step is None:
                return event
            event = replace(
                event,
                event_type=step.to_type,
                schema_version=step.to_version,
                data=step.transform(dict(event.data)),
            )
        raise ValueError(f"upcasters loop on {event.event_type} v{event.schema_version}")

    def __len__(self) -> int:
        return len(self._steps)
