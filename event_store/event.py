"""Events: immutable facts with a type name and a schema version.

A domain event is a frozen dataclass deriving from :class:`Event`; the class keywords name
it and give its schema version (``name`` defaults to the class name, ``version`` to 1)::

    @dataclass(frozen=True)
    class PostCreated(Event, name="PostCreated", version=2):
        post_id: int
        text: str

What the store writes is a :class:`NewEvent` (type, schema version, JSON data); what it
reads back is a :class:`RecordedEvent`, which adds the stream, version and global position.
"""

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import orjson

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class Event:
    """Base of domain events. Subclasses are frozen dataclasses."""

    event_name: ClassVar[str] = "Event"
    schema_version: ClassVar[int] = 1

    #: The Avro namespace of the event's record: its subject in the schema registry is
    #: ``<namespace>.<event_name>`` (:mod:`event_store.schemas`).
    namespace: ClassVar[str] = "io.tributary.events"

    def __init_subclass__(
        cls,
        *,
        name: str | None = None,
        version: int = 1,
        namespace: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init_subclass__(**kw)
        if version < 1:
            raise ValueError(f"{cls.__name__}: schema version must be >= 1, got {version}")
        cls.event_name = name or cls.__name__
        cls.schema_version = version
        if namespace is not None:
            cls.namespace = namespace


@dataclass(frozen=True, order=True)
class Position:
    """Where an event sits in the global order: its writer's transaction id, then its sequence.

    ``read_all`` returns events in this order. ``sequence`` alone is unique and grows with
    each insert, but a transaction that started earlier may commit later with a lower
    sequence; ordering by transaction first (and reading only finished transactions)
    is what lets a reader resume after a position without ever skipping an event.
    """

    transaction_id: int
    sequence: int

    def __str__(self) -> str:
        return f"{self.transaction_id}.{self.sequence}"

    @classmethod
    def parse(cls, text: str) -> "Position":
        """The inverse of ``str()``: ``"<transaction_id>.<sequence>"``."""
        tx, _, seq = text.partition(".")
        try:
            return cls(int(tx), int(seq))
        except ValueError as exc:
            raise ValueError(f"not a position: {text!r} (expected '<txid>.<sequence>')") from exc


@dataclass(frozen=True)
class NewEvent:
    """An event ready to append: type, schema version, JSON data and metadata; ``schema_id``
    is the id of its Avro schema in the schema registry (set by the codec once the domain's
    schemas are registered; None: published with the untyped envelope)."""

    event_type: str
    data: JsonObject
    schema_version: int = 1
    metadata: JsonObject = field(default_factory=dict)
    event_id: uuid.UUID = field(default_factory=uuid.uuid4)
    schema_id: int | None = None
    #: The start of its Kafka record value (set by the codec with ``schema_id``): the Confluent
    #: wire-format header and the Avro body of the event's own fields; the store appends the
    #: ``_meta`` envelope into the ``payload`` column the CDC outbox publishes as is.
    payload_head: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True)
class RecordedEvent:
    """An event as stored: a :class:`NewEvent` plus its stream, version and position.

    Events read from the store (:mod:`event_store.reading`) keep ``event_id``, ``data``,
    ``metadata``, ``recorded_at`` (UTC) and ``position`` in their stored form until first
    used: a consumer that looks at the type and stream of a million events does not pay
    for a million JSON decodes. Reading such a field decodes it once; the event is equal
    to, and behaves as, one built with every field given.
    """

    event_id: uuid.UUID
    stream_id: str
    stream_type: str
    version: int
    event_type: str
    schema_version: int
    data: JsonObject
    metadata: JsonObject
    recorded_at: datetime
    position: Position

    COLUMNS: ClassVar[tuple[str, ...]] = (
        "event_id",
        "stream_id",
        "stream_type",
        "version",
        "event_type",
        "schema_version",
        "data",
        "metadata",
        "recorded_at",
        "transaction_id",
        "position",
    )

    def __getstate__(self) -> dict[str, Any]:
        """Its state, fields a read left encoded staying encoded (a page's JSON texts taken
        out of the page: pickling one event does not carry its page)."""
        state = dict(self.__dict__)
        page = state.pop("_page", None)
        if page is not None:
            index = state.pop("_i")
            for name in ("data", "metadata"):
                if name not in state:
                    state[ENCODED[name]] = page.text(name, index)
        return state

    @classmethod
    def from_columns(cls, values: Sequence[Any]) -> "RecordedEvent":
        """Build from the events table's columns in :attr:`COLUMNS` order."""
        (
            event_id,
            stream_id,
            stream_type,
            version,
            event_type,
            schema_version,
            data,
            metadata,
            recorded_at,
            transaction_id,
            position,
        ) = values
        return cls(
            event_id=event_id,
            stream_id=stream_id,
            stream_type=stream_type,
            version=version,
            event_type=event_type,
            schema_version=schema_version,
            data=data,
            metadata=metadata,
            recorded_at=recorded_at,
            position=Position(transaction_id, position),
        )


#: Field → the key under which a bulk-read event keeps it encoded (the id's 16 bytes, JSON
#: text, microseconds since :data:`POSTGRES_EPOCH`, the position's two integers), until
#: ``RecordedEvent.__getattr__`` decodes it.
ENCODED = {
    "event_id": "_event_id",
    "data": "_data",
    "metadata": "_metadata",
    "recorded_at": "_recorded_at",
    "position": "_sequence",
}

#: PostgreSQL's binary timestamps count microseconds from here.
POSTGRES_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)

#: One JSON value from the start of a string (json's C scanner, without ``json.loads``'s
#: Python layers; jsonb's text has no surrounding blanks).
scan_json = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


#: orjson turns an integer beyond 64 bits (jsonb's numeric allows any) into a float, where
#: json keeps Python's exact int: a text with 19 digits in a row goes to json's scanner. The
#: digits are found by bytes.translate and find, both C loops (a regular expression took
#: longer than the decoding it saves).
_DIGIT_RUN = b"\x01" * 19
_DIGIT_TABLE = bytes(1 if 48 <= i <= 57 else 0 for i in range(256))  # ASCII 0-9 to 1


def decode_json(text: str) -> Any:
    """One JSON value (jsonb's text), as json's C scanner decodes it: with orjson (twice as
    fast on events' data) unless the text holds 19 digits in a row (an integer that may be
    beyond 64 bits, or a long decimal) or orjson refuses it (a number beyond a double)."""
    encoded = text.encode(errors="surrogatepass")  # (a lone surrogate: orjson refuses it)
    if encoded.translate(_DIGIT_TABLE).find(_DIGIT_RUN) < 0:
        try:
            return orjson.loads(encoded)
        except orjson.JSONDecodeError:
            pass
    return scan_json(text, 0)[0]


class _Encoded:
    """A field a read may leave encoded: looked up only when the event's ``__dict__`` does
    not hold it yet (a non-data descriptor, set on the class after ``@dataclass``), then
    decoded once and kept in the ``__dict__``."""

    __slots__ = ("key", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.key = ENCODED[name]

    def __get__(self, event: Any, owner: Any = None) -> Any:
        if event is None:
            raise AttributeError(f"type object {owner.__name__!r} has no attribute {self.name!r}")
        state = event.__dict__
        if self.key not in state:
            raise AttributeError(f"{type(event).__name__!r} object has no attribute {self.name!r}")
        name = self.name
        if name == "position":
            value: Any = Position(state["_transaction_id"], state["_sequence"])
        elif name == "event_id":
            value = uuid.UUID(bytes=state["_event_id"])
        else:  # recorded_at
            value = POSTGRES_EPOCH + timedelta(microseconds=state["_recorded_at"])
        state[name] = value
        return value


class _EncodedJson(_Encoded):
    """``data`` or ``metadata``: from the event's own JSON text (``_data``, ``_metadata``)
    or from its page (``_page``, ``_i``: a ``reading.JsonPage`` decodes its events' texts a
    block at a time, one scanner call per block)."""

    __slots__ = ()

    def __get__(self, event: Any, owner: Any = None) -> Any:
        if event is None:
            raise AttributeError(f"type object {owner.__name__!r} has no attribute {self.name!r}")
        state = event.__dict__
        page = state.get("_page")
        if page is not None:
            value = page.value(self.name, state["_i"])
        elif self.key in state:
            value = decode_json(state[self.key])
        else:
            raise AttributeError(f"{type(event).__name__!r} object has no attribute {self.name!r}")
        state[self.name] = value
        return value


for _name in ENCODED:
    setattr(
        RecordedEvent, _name, (_EncodedJson if _name in ("data", "metadata") else _Encoded)(_name)
    )


class EventRegistry:
    """The event classes a domain knows, by (name, schema version)."""

    def __init__(self, classes: "list[type[Event]] | None" = None) -> None:
        self._classes: dict[tuple[str, int], type[Event]] = {}
        for cls in classes or []:
            self.register(cls)

    def register(self, cls: type[Event]) -> type[Event]:
        """Add an event class (usable as a decorator); a name+version is taken once."""
        key = (cls.event_name, cls.schema_version)
        existing = self._classes.get(key)
        if existing is not None and existing is not cls:
            raise ValueError(
                f"event type {key[0]} v{key[1]} is already {existing.__qualname__}; "
                "bump the schema version and add an upcaster instead"
            )
        self._classes[key] = cls
        return cls

    def get(self, name: str, version: int) -> type[Event] | None:
        return self._classes.get((name, version))

    def classes(self) -> list[type[Event]]:
        return list(self._classes.values())

    def __contains__(self, key: tuple[str, int]) -> bool:
        return key in self._classes
