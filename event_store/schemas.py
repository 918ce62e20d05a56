"""Avro schemas of event classes, and their registration in a schema registry.

Each event class has one Avro record schema, derived from its dataclass fields::

    @dataclass(frozen=True)
    class PostCreated(Event, name="PostCreated", version=2):
        \"\"\"A post was written.\"\"\"          # -> the record's doc
        post_id: int                            # -> long
        text: str = field(metadata={"doc": "as written"})   # -> string, with a doc
        hashtags: tuple[str, ...]               # -> array of string
        created_at: datetime                    # -> long, logicalType timestamp-micros
        edited_at: datetime | None = None       # -> ["null", timestamp-micros], default null
        note: str = field(metadata=personal("post", "post_id"))  # -> bytes, encrypted

``int`` is ``long``, ``float`` ``double``, ``bool`` ``boolean``, ``str`` ``string``, ``bytes``
``bytes``; ``datetime`` is ``timestamp-micros``, ``date`` ``date``, ``UUID`` a ``uuid``
string; tuples, lists and sets are arrays, ``dict[str, X]`` maps, a nested dataclass a
record, ``X | None`` a union with null. A field with a default gets it as the Avro default.
The record is named ``<namespace>.<event_name>`` (``Event.namespace``, default
``io.tributary.events``) — the registry subject under the record-name strategy — and ends
with the ``_meta`` envelope (:data:`connectors.avro.EVENT_META_SCHEMA`). A personal field
(:func:`event_store.personal.personal`) is ``bytes`` (its encrypted token) with the property
``tributary.personal``: ``{"subject", "id_field", "type": <the plain value's Avro type>}``.

:func:`register_event_schemas` registers every class of a domain before anything is appended
(the command bus's entry points call it at start); an incompatible change (error 409) raises
:class:`EventSchemaError` naming the event type and the fields, so no event of that version is
ever appended. The ids go to the codec, which stamps each new event with its schema's id; the
CDC outbox encodes the row with that id.
"""

import dataclasses
import json
import types
import typing
import uuid
from collections.abc import Iterable, Mapping
from datetime import date, datetime
from typing import Any, Protocol

from connectors.avro import EVENT_META_SCHEMA, META_FIELD, full_name
from event_store.errors import EventStoreError
from event_store.event import Event
from event_store.personal import PERSONAL_PROPERTY, Personal, personal_fields

_PRIMITIVES: dict[Any, Any] = {
    bool: "boolean",
    int: "long",
    float: "double",
    str: "string",
    bytes: "bytes",
    datetime: {"type": "long", "logicalType": "timestamp-micros"},
    date: {"type": "int", "logicalType": "date"},
    uuid.UUID: {"type": "string", "logicalType": "uuid"},
}
_ARRAYS = (tuple, list, set, frozenset)


class EventSchemaError(EventStoreError):
    """An event class has no Avro form, or the registry refused its schema."""


class SchemaRegistrar(Protocol):
    """What registration needs of a registry client
    (:class:`connectors.schema_registry.client.RegistryClient` has it)."""

    def lookup(self, subject: str, schema: str) -> dict[str, Any] | None: ...

    def register(self, subject: str, schema: str) -> int: ...

    def check(self, subject: str, schema: str) -> list[str]: ...


def subject_of(cls: type[Event]) -> str:
    """The registry subject of an event class: its record's full name."""
    return f"{cls.namespace}.{cls.event_name}"


def avro_schema(cls: type[Event]) -> dict[str, Any]:
    """The Avro record schema of an event class (see the module's doc)."""
    if not dataclasses.is_dataclass(cls):
        raise EventSchemaError(f"{cls.__qualname__} is not a dataclass")
    personal_fields(cls)  # checks the marks
    record = _record(cls, cls.event_name, cls.namespace, {})
    if any(f["name"] == META_FIELD for f in record["fields"]):
        raise EventSchemaError(f"{cls.__qualname__}: the field name {META_FIELD} is reserved")
    record["fields"].append(
        {
            "name": META_FIELD,
            "type": EVENT_META_SCHEMA,
            "doc": "The event's envelope: id, type, stream, version, position, time, metadata.",
        }
    )
    return record


def _doc(cls: type[Any]) -> str | None:
    doc = cls.__dict__.get("__doc__")
    if not doc or doc.startswith(f"{cls.__name__}("):  # dataclass's generated signature
        return None
    return " ".join(doc.split())


def _record(
    cls: type[Any], name: str, namespace: str, seen: dict[type[Any], str]
) -> dict[str, Any]:
    full = f"{namespace}.{name}"
    seen[cls] = full
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        where = f"{cls.__qualname__}.{f.name}"
        avro: dict[str, Any] = {
            "name": f.name,
            "type": _type(hints[f.name], where, namespace, seen),
        }
        doc = f.metadata.get("doc")
        if doc:
            avro["doc"] = str(doc)
        mark = f.metadata.get("personal")
        if isinstance(mark, Personal):
            # Stored and published encrypted: opaque bytes (the token of
            # event_store.personal) to any reader; the property says whose and what is inside.
            plain = avro["type"]
            nullable = isinstance(plain, list) and plain[0] == "null"
            avro["type"] = ["null", "bytes"] if nullable else "bytes"
            avro[PERSONAL_PROPERTY] = {
                "subject": mark.subject,
                "id_field": mark.id_field,
                "type": plain,
            }
            if f.default is not dataclasses.MISSING and f.default is not None:
                raise EventSchemaError(f"{where}: a personal field's default can only be None")
        default: Any = dataclasses.MISSING
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        if default is not dataclasses.MISSING:
            avro["default"] = _default(default, avro["type"], where)
        fields.append(avro)
    record: dict[str, Any] = {"type": "record", "name": name, "namespace": namespace}
    doc = _doc(cls)
    if doc:
        record["doc"] = doc
    record["fields"] = fields
    return record


def _type(hint: Any, where: str, namespace: str, seen: dict[type[Any], str]) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        return _type(args[0], where, namespace, seen)
    if origin in (typing.Union, types.UnionType):
        others = [a for a in args if a is not type(None)]
        if len(others) != 1:
            raise EventSchemaError(f"{where}: only `X | None` unions have an Avro form")
        inner = _type(others[0], where, namespace, seen)
        return ["null", inner] if len(others) < len(args) else inner
    if hint in _PRIMITIVES:
        found = _PRIMITIVES[hint]
        return dict(found) if isinstance(found, dict) else found
    if origin in _ARRAYS or hint in _ARRAYS:
        if not args or (origin is tuple and not (len(args) == 2 and args[1] is Ellipsis)):
            raise EventSchemaError(f"{where}: use tuple[X, ...], list[X] or frozenset[X]")
        return {"type": "array", "items": _type(args[0], where, namespace, seen)}
    if origin in (dict, Mapping) and args and args[0] is str:
        return {"type": "map", "values": _type(args[1], where, namespace, seen)}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if hint in seen:
            return seen[hint]
        return _record(hint, hint.__name__, namespace, seen)
    raise EventSchemaError(f"{where}: {hint!r} has no Avro form here")


def _default(value: Any, avro_type: Any, where: str) -> Any:
    if value is None:
        if not (isinstance(avro_type, list) and avro_type[0] == "null"):
            raise EventSchemaError(f"{where}: a None default needs an `X | None` field")
        return None
    if isinstance(avro_type, list):
        raise EventSchemaError(f"{where}: an `X | None` field's default must be None")
    if isinstance(value, _ARRAYS):
        return list(value)
    if isinstance(value, bool | int | float | str | dict):
        return value
    raise EventSchemaError(f"{where}: the default {value!r} has no Avro form")


def register_event_schemas(
    classes: Iterable[type[Event]], registry: SchemaRegistrar
) -> dict[tuple[str, int], int]:
    """Register each class's schema under its subject, oldest version first; the schema ids
    by (event name, schema version). Raises :class:`EventSchemaError` naming the event and
    the incompatible fields when the registry refuses one (nothing of it can be appended)."""
    from connectors.schema_registry.errors import RegistryUnavailableError, SchemaRegistryError

    ids: dict[tuple[str, int], int] = {}
    for cls in sorted(classes, key=lambda c: (c.event_name, c.schema_version)):
        subject = subject_of(cls)
        schema = avro_schema(cls)
        document = _document(schema)
        try:
            # A lookup first: a read, where registering writes to the registry's store; the
            # schemas are already there at every start but the first.
            known = registry.lookup(subject, document)
            ids[(cls.event_name, cls.schema_version)] = (
                int(known["id"]) if known is not None else registry.register(subject, document)
            )
        except RegistryUnavailableError:
            raise  # not the schema's fault: the caller retries or fails as unavailable
        except SchemaRegistryError as exc:
            if exc.error_code != 409:
                raise EventSchemaError(
                    f"cannot register the schema of {cls.event_name} v{cls.schema_version}"
                    f" (subject {subject}): {exc}"
                ) from exc
            found = registry.check(subject, document)
            reasons = [m for m in found if "errorType" in m] or found or [str(exc)]
            raise EventSchemaError(
                f"{cls.event_name} v{cls.schema_version} ({cls.__qualname__}) is incompatible"
                f" with the versions registered under {subject}: {'; '.join(reasons)}."
                " Give new fields a default (`X | None = None`), or publish the change as a"
                " new event type with an upcaster from the old one"
            ) from exc
    return ids


def _document(schema: Mapping[str, Any]) -> str:
    return json.dumps(schema, separators=(",", ":"))


__all__ = [
    "EventSchemaError",
    "SchemaRegistrar",
    "avro_schema",
    "full_name",
    "register_event_schemas",
    "subject_of",
]
