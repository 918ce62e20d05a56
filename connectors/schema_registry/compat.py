"""Avro schema resolution as a pure check: can a reader schema read what a writer schema wrote?

The rules are those of the Avro specification ("Schema Resolution"), in the form Avro's own
``SchemaCompatibility`` (which Confluent's registry uses) applies them:

- same primitive type, or a promotion of the writer's type: int → long, float, double;
  long → float, double; float → double; string ↔ bytes (logical types are not considered);
- records with the same unqualified name (or a reader alias equal to the writer's full name):
  every reader field is in the writer (by name or a reader field alias) with a readable type,
  or has a default; writer fields the reader lacks are skipped;
- enums with the same name: every writer symbol is a reader symbol, unless the reader has a
  default symbol; fixed types with the same name and size;
- arrays and maps: their items and values resolve;
- a writer union: each of its branches must be readable; a reader union: some branch reads the
  writer's type.

:func:`incompatibilities` lists what fails, each with Avro's incompatibility type and the path
in the reader schema; an empty list means the reader can read every datum of the writer.
"""

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
# (writer type, reader type) pairs the reader accepts besides equal types.
PROMOTIONS = frozenset(
    {
        ("int", "long"),
        ("int", "float"),
        ("int", "double"),
        ("long", "float"),
        ("long", "double"),
        ("float", "double"),
        ("string", "bytes"),
        ("bytes", "string"),
    }
)


class SchemaStructureError(ValueError):
    """The JSON is not an Avro schema this module can follow (an unknown named type, ...)."""


@dataclass(frozen=True)
class Incompatibility:
    """One reason a reader cannot read a writer's data (``kind``: Avro's name for it)."""

    kind: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind} at {self.path}: {self.message}"


# -- the schema as a tree of nodes (named types shared, so recursion is a cycle) ------------


@dataclass(eq=False)
class _Primitive:
    type: str


@dataclass(eq=False)
class _Field:
    name: str
    aliases: frozenset[str]
    type: "_Node"
    has_default: bool


@dataclass(eq=False)
class _Record:
    fullname: str
    aliases: frozenset[str]
    fields: list[_Field] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.fullname.rsplit(".", 1)[-1]


@dataclass(eq=False)
class _Enum:
    fullname: str
    aliases: frozenset[str]
    symbols: tuple[str, ...]
    default: str | None

    @property
    def name(self) -> str:
        return self.fullname.rsplit(".", 1)[-1]


@dataclass(eq=False)
class _Fixed:
    fullname: str
    aliases: frozenset[str]
    size: int

    @property
    def name(self) -> str:
        return self.fullname.rsplit(".", 1)[-1]


@dataclass(eq=False)
class _Array:
    items: "_Node"


@dataclass(eq=False)
class _Map:
    values: "_Node"


@dataclass(eq=False)
class _Union:
    branches: list["_Node"]


_Named = _Record | _Enum | _Fixed
_Node = _Primitive | _Named | _Array | _Map | _Union


def _fullname(name: str, namespace: str | None) -> str:
    if "." in name or not namespace:
        return name
    return f"{namespace}.{name}"


def _namespace_of(fullname: str) -> str | None:
    return fullname.rsplit(".", 1)[0] if "." in fullname else None


class _Builder:
    """Turns schema JSON into nodes, resolving named-type references by full name."""

    def __init__(self) -> None:
        self.named: dict[str, _Named] = {}

    def build(self, schema: Any, namespace: str | None = None) -> _Node:
        if isinstance(schema, str):
            return self._reference(schema, namespace)
        if isinstance(schema, list):
            return _Union([self.build(branch, namespace) for branch in schema])
        if not isinstance(schema, Mapping):
            raise SchemaStructureError(f"not an Avro schema: {schema!r}")
        kind = schema.get("type")
        if isinstance(kind, list | Mapping):
            return self.build(kind, namespace)
        if kind in PRIMITIVES:
            return _Primitive(str(kind))
        if kind == "array":
            return _Array(self.build(schema.get("items"), namespace))
        if kind == "map":
            return _Map(self.build(schema.get("values"), namespace))
        if kind in ("record", "error", "enum", "fixed"):
            return self._named(schema, str(kind), namespace)
        if isinstance(kind, str):
            return self._reference(kind, namespace)
        raise SchemaStructureError(f"a schema object needs a type: {dict(schema)!r}")

    def _reference(self, name: str, namespace: str | None) -> _Node:
        if name in PRIMITIVES:
            return _Primitive(name)
        for candidate in (_fullname(name, namespace), name):
            if candidate in self.named:
                return self.named[candidate]
        raise SchemaStructureError(f"unknown type {name!r}")

    def _named(self, schema: Mapping[str, Any], kind: str, namespace: str | None) -> _Named:
        name = schema.get("name")
        if not isinstance(name, str) or not name:
            raise SchemaStructureError(f"a {kind} needs a name")
        own_namespace = schema.get("namespace", namespace) if "." not in name else None
        fullname = _fullname(name, own_namespace or None)
        inner = _namespace_of(fullname)
        aliases = frozenset(_fullname(a, inner) for a in schema.get("aliases", ()))
        node: _Named
        if kind == "enum":
            default = schema.get("default")
            symbols = tuple(str(s) for s in schema.get("symbols", ()))
            node = _Enum(fullname, aliases, symbols, default if isinstance(default, str) else None)
        elif kind == "fixed":
            node = _Fixed(fullname, aliases, int(schema.get("size", -1)))
        else:
            node = _Record(fullname, aliases)
        self.named[fullname] = node  # before the fields: a record may refer to itself
        if isinstance(node, _Record):
            for item in schema.get("fields", ()):
                node.fields.append(
                    _Field(
                        str(item["name"]),
                        frozenset(str(a) for a in item.get("aliases", ())),
                        self.build(item["type"], inner),
                        "default" in item,
                    )
                )
        return node


def parse(schema: Any) -> _Node:
    """The schema JSON (already decoded) as a tree of nodes."""
    return _Builder().build(schema)


# -- the check ------------------------------------------------------------------------------


def incompatibilities(reader: Any, writer: Any) -> list[Incompatibility]:
    """Why ``reader`` cannot read data written with ``writer`` (both decoded schema JSON);
    empty when it can."""
    checker = _Checker()
    checker.check(parse(reader), parse(writer), "")
    return checker.found


def can_read(reader: Any, writer: Any) -> bool:
    return not incompatibilities(reader, writer)


def describe(node: _Node) -> str:
    """A short name for a node in messages: ``int``, ``record Post``, ``array``, ..."""
    if isinstance(node, _Primitive):
        return node.type
    if isinstance(node, _Record):
        return f"record {node.fullname}"
    if isinstance(node, _Enum):
        return f"enum {node.fullname}"
    if isinstance(node, _Fixed):
        return f"fixed {node.fullname}"
    if isinstance(node, _Array):
        return "array"
    if isinstance(node, _Map):
        return "map"
    return "union [" + ", ".join(describe(b) for b in node.branches) + "]"


class _Checker:
    def __init__(self) -> None:
        self.found: list[Incompatibility] = []
        self._assumed: set[tuple[int, int]] = set()  # record pairs under check (recursion)

    def _report(self, kind: str, path: str, message: str) -> None:
        self.found.append(Incompatibility(kind, path or "/", message))

    def _quiet(self, reader: _Node, writer: _Node, path: str) -> list[Incompatibility]:
        probe = _Checker()
        probe._assumed = set(self._assumed)
        probe.check(reader, writer, path)
        return probe.found

    def check(self, reader: _Node, writer: _Node, path: str) -> None:
        if isinstance(writer, _Union):
            for index, branch in enumerate(writer.branches):
                if isinstance(reader, _Union):
                    if not any(not self._quiet(r, branch, path) for r in reader.branches):
                        self._report(
                            "MISSING_UNION_BRANCH",
                            path,
                            f"the reader's union has no branch that reads the writer's union"
                            f" branch {index} ({describe(branch)})",
                        )
                else:
                    self.check(reader, branch, path)
            return
        if isinstance(reader, _Union):
            if not any(not self._quiet(branch, writer, path) for branch in reader.branches):
                self._report(
                    "TYPE_MISMATCH",
                    path,
                    f"no branch of the reader's {describe(reader)} reads the writer's"
                    f" {describe(writer)}",
                )
            return
        self._same_kind(reader, writer, path)

    def _same_kind(self, reader: _Node, writer: _Node, path: str) -> None:
        if isinstance(reader, _Primitive) and isinstance(writer, _Primitive):
            if reader.type != writer.type and (writer.type, reader.type) not in PROMOTIONS:
                self._mismatch(reader, writer, path)
        elif isinstance(reader, _Array) and isinstance(writer, _Array):
            self.check(reader.items, writer.items, f"{path}/items")
        elif isinstance(reader, _Map) and isinstance(writer, _Map):
            self.check(reader.values, writer.values, f"{path}/values")
        elif isinstance(reader, _Record) and isinstance(writer, _Record):
            if self._names_match(reader, writer, path):
                self._records(reader, writer, path)
        elif isinstance(reader, _Enum) and isinstance(writer, _Enum):
            if self._names_match(reader, writer, path):
                missing = [s for s in writer.symbols if s not in reader.symbols]
                if missing and reader.default is None:
                    self._report(
                        "MISSING_ENUM_SYMBOLS",
                        f"{path}/symbols",
                        f"the reader's enum {reader.fullname} lacks the writer's symbols"
                        f" {', '.join(missing)} and has no default symbol",
                    )
        elif isinstance(reader, _Fixed) and isinstance(writer, _Fixed):
            if self._names_match(reader, writer, path) and reader.size != writer.size:
                self._report(
                    "FIXED_SIZE_MISMATCH",
                    f"{path}/size",
                    f"the reader's fixed {reader.fullname} has size {reader.size}, the"
                    f" writer's {writer.size}",
                )
        else:
            self._mismatch(reader, writer, path)

    def _mismatch(self, reader: _Node, writer: _Node, path: str) -> None:
        self._report(
            "TYPE_MISMATCH",
            path,
            f"the reader's type {describe(reader)} cannot read the writer's type"
            f" {describe(writer)}",
        )

    def _names_match(self, reader: _Named, writer: _Named, path: str) -> bool:
        if reader.name == writer.name or writer.fullname in reader.aliases:
            return True
        self._report(
            "NAME_MISMATCH",
            f"{path}/name",
            f"the reader's {reader.fullname} does not match the writer's {writer.fullname}"
            " (same name, or a reader alias naming the writer's type, needed)",
        )
        return False

    def _records(self, reader: _Record, writer: _Record, path: str) -> None:
        pair = (id(reader), id(writer))
        if pair in self._assumed:
            return  # a recursive type: this pair is already being checked further up
        self._assumed.add(pair)
        by_name = {f.name: f for f in writer.fields}
        for index, field_ in enumerate(reader.fields):
            where = f"{path}/fields/{index}"
            source = next(_candidates(field_, by_name), None)
            if source is not None:
                self.check(field_.type, source.type, f"{where}/type")
            elif not field_.has_default:
                self._report(
                    "READER_FIELD_MISSING_DEFAULT_VALUE",
                    where,
                    f'the reader\'s field "{field_.name}" of {reader.fullname} has no default'
                    " value and is missing from the writer's schema",
                )


def _candidates(field_: _Field, by_name: Mapping[str, _Field]) -> Iterator[_Field]:
    for name in (field_.name, *sorted(field_.aliases)):
        if name in by_name:
            yield by_name[name]


# -- compatibility levels -------------------------------------------------------------------

LEVELS = (
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
    "NONE",
)
DEFAULT_LEVEL = "BACKWARD"


def is_transitive(level: str) -> bool:
    """Whether ``level`` checks against every earlier version, not only the latest."""
    return level.endswith("_TRANSITIVE")


def level_incompatibilities(level: str, new: Any, old: Any) -> list[Incompatibility]:
    """What stops ``new`` from being accepted after ``old`` under ``level``: BACKWARD means
    the new schema reads the old one's data, FORWARD the old reads the new one's, FULL both."""
    if level not in LEVELS:
        raise ValueError(f"unknown compatibility level {level!r}; choose from {', '.join(LEVELS)}")
    found: list[Incompatibility] = []
    if level.startswith(("BACKWARD", "FULL")):
        found += [
            Incompatibility(i.kind, i.path, f"new schema reading old data: {i.message}")
            for i in incompatibilities(new, old)
        ]
    if level.startswith(("FORWARD", "FULL")):
        found += [
            Incompatibility(i.kind, i.path, f"old schema reading new data: {i.message}")
            for i in incompatibilities(old, new)
        ]
    return found
