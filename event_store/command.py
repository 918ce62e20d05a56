"""Commands (requests to change a stream) and their results.

A command is a frozen dataclass deriving from :class:`Command`; ``name`` (default: the class
name) is its type on the wire. Its result is :class:`Accepted` or :class:`Rejected`.
"""

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from event_store.event import JsonObject, Position


@dataclass(frozen=True)
class Command:
    """Base of commands. Subclasses are frozen dataclasses."""

    command_name: ClassVar[str] = "Command"

    def __init_subclass__(cls, *, name: str | None = None, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.command_name = name or cls.__name__


@dataclass(frozen=True)
class Accepted:
    """The command's events are stored: the stream now stands at ``version``."""

    command_id: str
    stream_id: str
    stream_type: str
    version: int
    event_ids: tuple[str, ...]
    position: Position | None  # of the last event; None when the command decided nothing
    status: Literal["accepted"] = "accepted"

    @property
    def position_token(self) -> str:
        """``<stream_type>/<stream_id>@<version>``: what a caller waits on to read its write
        in the views (``views.read_your_writes.ViewWaiter``)."""
        return position_token(self.stream_type, self.stream_id, self.version)

    def to_json(self) -> JsonObject:
        return {
            "status": self.status,
            "command_id": self.command_id,
            "stream_id": self.stream_id,
            "stream_type": self.stream_type,
            "version": self.version,
            "event_ids": list(self.event_ids),
            "position": None if self.position is None else str(self.position),
            "position_token": self.position_token,
        }


@dataclass(frozen=True)
class Rejected:
    """The command was refused; nothing was stored. ``reason`` says why."""

    command_id: str | None
    reason: str
    status: Literal["rejected"] = "rejected"

    def to_json(self) -> JsonObject:
        return {"status": self.status, "command_id": self.command_id, "reason": self.reason}


CommandResult = Accepted | Rejected


def position_token(stream_type: str, stream_id: str, version: int) -> str:
    """The position token of a stream at ``version`` (``post/post-12@3``)."""
    return f"{stream_type}/{stream_id}@{version}"


def result_from_json(data: JsonObject) -> CommandResult:
    """The inverse of ``to_json()`` of either result (``position_token`` is derived, so JSON
    without it, written before tokens existed, reads the same)."""
    if data.get("status") == "accepted":
        position = data.get("position")
        return Accepted(
            command_id=str(data["command_id"]),
            stream_id=str(data["stream_id"]),
            stream_type=str(data["stream_type"]),
            version=int(data["version"]),
            event_ids=tuple(str(e) for e in data["event_ids"]),
            position=None if position is None else Position.parse(str(position)),
        )
    if data.get("status") == "rejected":
        command_id = data.get("command_id")
        return Rejected(None if command_id is None else str(command_id), str(data["reason"]))
    raise ValueError(f"not a command result: {data!r}")
