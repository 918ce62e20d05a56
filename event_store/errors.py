"""Errors of the event store and command processing.

Catch :class:`EventStoreError` for anything this package raises, or a subclass by cause.
"""

from tributary.errors import TributaryError


class EventStoreError(TributaryError):
    """Base of every error raised by :mod:`event_store`."""


class ConcurrencyError(EventStoreError):
    """Another writer appended to the stream first: reload the stream and decide again."""

    def __init__(self, stream_id: str, expected_version: int, actual_version: int | None) -> None:
        actual = "unknown" if actual_version is None else str(actual_version)
        super().__init__(
            f"stream {stream_id!r}: expected version {expected_version}, found {actual}; "
            "reload the stream and retry the command"
        )
        self.stream_id = stream_id
        self.expected_version = expected_version
        self.actual_version = actual_version


class StorageError(EventStoreError):
    """PostgreSQL refused or failed a store operation; ``sqlstate`` is its error code."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message if sqlstate is None else f"{message} [SQLSTATE {sqlstate}]")
        self.sqlstate = sqlstate


class FencedError(StorageError):
    """The write's fence refused it (its writer no longer owns what it wrote for: another
    instance took it over); nothing of the command was stored."""


class SchemaMissingError(StorageError):
    """The store's tables are not there: run ``create_schema`` (``tributary run-commands`` does)."""


class UnknownEventTypeError(EventStoreError):
    """A stored event has a type/schema version no registered class or upcaster handles."""


class EventDecodeError(EventStoreError):
    """A stored event's data does not fit its class: add or fix an upcaster."""


class UnknownCommandTypeError(EventStoreError):
    """A command type no handler is registered for."""


class CommandDecodeError(EventStoreError):
    """A command's data is malformed (missing fields, wrong types, not an object)."""


class MalformedCommandError(EventStoreError):
    """A ``commands`` message that is not a command envelope; ``command_id`` if one was found."""

    def __init__(self, reason: str, command_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.command_id = command_id


class CommandRejected(EventStoreError):
    """Raised by a command handler to refuse a command; the reason goes back to the sender."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CommandTimeoutError(EventStoreError):
    """No result arrived on the results topic in time: is `tributary run commands` running?"""
