"""What a recorder needs to know besides its connections: where the store is and whose it is."""

from dataclasses import dataclass
from typing import Literal

from event_store.schema import DEFAULT_SCHEMA, check_identifier

#: Application name of recorders made without one (a bare factory, a test).
DEFAULT_APPLICATION = "eventsourcing"


@dataclass(frozen=True)
class RecorderConfig:
    """``schema``: the event store schema (its ``events`` table is the CDC outbox);
    ``application``: the application whose notification sequence, tracking records and
    snapshots the recorder keeps; ``originator_id_type``: ``uuid`` (ids come back as
    :class:`uuid.UUID`) or ``text``; ``lock_timeout``: seconds a write waits for the
    application's notification counter (0: no limit), the library's ``POSTGRES_LOCK_TIMEOUT``.
    """

    schema: str = DEFAULT_SCHEMA
    application: str = DEFAULT_APPLICATION
    originator_id_type: Literal["uuid", "text"] = "uuid"
    lock_timeout: int = 0

    def __post_init__(self) -> None:
        check_identifier(self.schema)
        if self.originator_id_type not in ("uuid", "text"):
            raise ValueError(
                f"originator_id_type must be 'uuid' or 'text', got {self.originator_id_type!r}"
            )
