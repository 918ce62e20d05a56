"""Turning domain events into JSON rows and back (with upcasting), validated by pydantic."""

from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from connectors.avro import AvroSchema, from_json
from event_store.errors import EventDecodeError, EventStoreError, UnknownEventTypeError
from event_store.event import Event, EventRegistry, JsonObject, NewEvent, RecordedEvent
from event_store.personal import KeyStore, Personal, encrypt_data, personal_fields
from event_store.upcasting import Upcasters

if TYPE_CHECKING:
    from event_store.schemas import SchemaRegistrar

T = TypeVar("T")


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def adapter(cls: type[T]) -> TypeAdapter[T]:
    """One pydantic adapter per dataclass (building one is the expensive part)."""
    found = _ADAPTERS.get(cls)
    if found is None:
        found = _ADAPTERS[cls] = TypeAdapter(cls)
    return found


def to_json(value: object) -> JsonObject:
    """A dataclass instance as a JSON-ready dict (datetimes as ISO 8601, tuples as lists)."""
    data: Any = adapter(type(value)).dump_python(value, mode="json")
    if not isinstance(data, dict):
        raise TypeError(f"{type(value).__name__} does not serialise to a JSON object")
    return data


class EventCodec:
    """Encodes events for the store and decodes stored events into the current classes."""

    def __init__(self, events: EventRegistry, upcasters: Upcasters | None = None) -> None:
        self.events = events
        self.upcasters = upcasters or Upcasters()
        self.schema_ids: dict[tuple[str, int], int] = {}
        self._heads: dict[tuple[str, int], AvroSchema] = {}
        self._personal: dict[type[Any], dict[str, Personal]] = {}

    def register_schemas(self, registry: "SchemaRegistrar") -> dict[tuple[str, int], int]:
        """Register the Avro schema of every event class in the schema registry
        (:func:`event_store.schemas.register_event_schemas`: an incompatible one raises,
        naming the fields); from then on each encoded event carries its schema's id."""
        from event_store.schemas import avro_schema, register_event_schemas

        classes = self.events.classes()
        self.schema_ids = register_event_schemas(classes, registry)
        heads = {}
        for cls in classes:
            record = avro_schema(cls)
            record["fields"] = record["fields"][:-1]  # all but _meta, the store appends it
            heads[(cls.event_name, cls.schema_version)] = AvroSchema.of(record)
        self._heads = heads
        return self.schema_ids

    def encode(
        self, event: Event, metadata: JsonObject | None = None, keys: "KeyStore | None" = None
    ) -> NewEvent:
        """The event as stored; its personal fields (:mod:`event_store.personal`) encrypted
        with their subjects' keys from ``keys`` (required when it has any)."""
        if (event.event_name, event.schema_version) not in self.events:
            raise UnknownEventTypeError(
                f"{type(event).__qualname__} ({event.event_name} v{event.schema_version}) "
                "is not registered with this domain's EventRegistry"
            )
        key = (event.event_name, event.schema_version)
        data = to_json(event)
        marks = self._personal.get(type(event))
        if marks is None:
            marks = self._personal[type(event)] = personal_fields(type(event))
        if marks:
            if keys is None:
                raise EventStoreError(
                    f"{event.event_name} has personal fields ({', '.join(marks)}): encoding it"
                    " needs the subjects' keys (event_store.personal)"
                )
            data = encrypt_data(marks, data, keys)
        schema_id = self.schema_ids.get(key)
        head = self._heads.get(key)
        return NewEvent(
            event_type=event.event_name,
            schema_version=event.schema_version,
            data=data,
            metadata=metadata or {},
            schema_id=schema_id,
            payload_head=(
                None
                if schema_id is None or head is None
                else head.encode(schema_id, from_json(head.definition, data))
            ),
        )

    def decode(self, recorded: RecordedEvent) -> Event:
        """The stored event upcast to its newest shape and validated into its class (its
        personal fields hold their encrypted tokens: aggregates decide without them; readers
        decrypt with :func:`event_store.personal.decrypt_data`)."""
        current = self.upcasters.upcast(recorded)
        cls = self.events.get(current.event_type, current.schema_version)
        if cls is None:
            raise UnknownEventTypeError(
                f"event {recorded.event_id} ({recorded.event_type} v{recorded.schema_version}, "
                f"upcast to {current.event_type} v{current.schema_version}) has no class: "
                "register the class or an upcaster to a registered version"
            )
        try:
            event: Event = adapter(cls).validate_python(current.data)
        except ValidationError as exc:
            raise EventDecodeError(
                f"event {recorded.event_id} does not fit {cls.__qualname__} (add or fix an "
                f"upcaster from {recorded.event_type} v{recorded.schema_version}): {exc}"
            ) from exc
        return event
