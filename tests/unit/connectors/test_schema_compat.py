"""The Avro resolution check, case by case; each case with a datum is cross-checked by writing
the datum with the writer schema and reading it with the reader schema in fastavro."""

import io
from dataclasses import dataclass
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.read import SchemaResolutionError

from connectors.schema_registry.compat import (
    LEVELS,
    SchemaStructureError,
    can_read,
    incompatibilities,
    level_incompatibilities,
)


def record(name: str, *fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "namespace": "t", "fields": list(fields), **extra}


def f(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


NO_DATUM = object()  # a case without a datum is not cross-checked
ENUM_AB = {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}
ENUM_A = {"type": "enum", "name": "Kind", "symbols": ["A"]}


@dataclass(frozen=True)
class Case:
    id: str
    writer: Any
    reader: Any
    compatible: bool
    kind: str | None = None  # the incompatibility expected
    datum: Any = NO_DATUM  # written with the writer, read with the reader


CASES = [
    Case("same primitive", "int", "int", True, datum=5),
    Case("int to long", "int", "long", True, datum=7),
    Case("int to float", "int", "float", True, datum=7),
    Case("int to double", "int", "double", True, datum=7),
    Case("long to double", "long", "double", True, datum=2**40),
    Case("float to double", "float", "double", True, datum=1.5),
    Case("string to bytes", "string", "bytes", True, datum="hi"),
    Case("bytes to string", "bytes", "string", True, datum=b"hi"),
    Case("long to int", "long", "int", False, "TYPE_MISMATCH", datum=1),
    Case("double to float", "double", "float", False, "TYPE_MISMATCH", datum=1.0),
    Case("string to int", "string", "int", False, "TYPE_MISMATCH", datum="x"),
    Case(
        "logical type ignored",
        {"type": "long", "logicalType": "timestamp-millis"},
        "long",
        True,
        datum=1,
    ),
    Case(
        "field added with default",
        record("P", f("id", "string")),
        record("P", f("id", "string"), f("n", "int", default=0)),
        True,
        datum={"id": "a"},
    ),
    Case(
        "field added without default",
        record("P", f("id", "string")),
        record("P", f("id", "string"), f("n", "int")),
        False,
        "READER_FIELD_MISSING_DEFAULT_VALUE",
        datum={"id": "a"},
    ),
    Case(
        "field removed (reader skips it)",
        record("P", f("id", "string"), f("n", "int")),
        record("P", f("id", "string")),
        True,
        datum={"id": "a", "n": 1},
    ),
    Case(
        "optional field added",
        record("P", f("id", "string")),
        record("P", f("id", "string"), f("note", ["null", "string"], default=None)),
        True,
        datum={"id": "a"},
    ),
    Case(
        "field renamed with an alias",
        record("P", f("old", "string")),
        record("P", f("new", "string", aliases=["old"])),
        True,
        datum={"old": "a"},
    ),
    Case(
        "field type promoted",
        record("P", f("n", "int")),
        record("P", f("n", "long")),
        True,
        datum={"n": 3},
    ),
    Case(
        "field type narrowed",
        record("P", f("n", "long")),
        record("P", f("n", "int")),
        False,
        "TYPE_MISMATCH",
        datum={"n": 3},
    ),
    Case(
        "record renamed",
        record("P", f("id", "string")),
        record("Q", f("id", "string")),
        False,
        "NAME_MISMATCH",
        datum={"id": "a"},
    ),
    Case(
        "record renamed with an alias",
        record("P", f("id", "string")),
        record("Q", f("id", "string"), aliases=["t.P"]),
        True,
        datum={"id": "a"},
    ),
    Case("enum symbol added", ENUM_A, ENUM_AB, True, datum="A"),
    Case("enum symbol removed", ENUM_AB, ENUM_A, False, "MISSING_ENUM_SYMBOLS", datum="B"),
    Case(
        "enum symbol removed, reader default",
        ENUM_AB,
        {**ENUM_A, "default": "A"},
        True,
        datum="B",
    ),
    Case(
        "fixed size changed",
        {"type": "fixed", "name": "H", "size": 4},
        {"type": "fixed", "name": "H", "size": 8},
        False,
        "FIXED_SIZE_MISMATCH",
    ),
    Case(
        "array items promoted",
        {"type": "array", "items": "int"},
        {"type": "array", "items": "long"},
        True,
        datum=[1, 2],
    ),
    Case(
        "array items narrowed",
        {"type": "array", "items": "long"},
        {"type": "array", "items": "int"},
        False,
        "TYPE_MISMATCH",
        datum=[1],
    ),
    Case(
        "map values changed",
        {"type": "map", "values": "string"},
        {"type": "map", "values": "int"},
        False,
        "TYPE_MISMATCH",
        datum={"a": "b"},
    ),
    Case(
        "array to map",
        {"type": "array", "items": "int"},
        {"type": "map", "values": "int"},
        False,
        "TYPE_MISMATCH",
        datum=[1],
    ),
    Case("type into union", "string", ["null", "string"], True, datum="x"),
    Case(
        "union to type it lacks", ["null", "string"], "string", False, "TYPE_MISMATCH", datum=None
    ),
    Case("union branch added", ["null", "string"], ["null", "string", "int"], True, datum="x"),
    Case(
        "union branch removed",
        ["null", "string", "int"],
        ["null", "string"],
        False,
        "MISSING_UNION_BRANCH",
        datum=4,
    ),
    Case("union branch promoted", ["null", "int"], ["null", "long"], True, datum=4),
    Case("type not in reader union", "int", ["null", "string"], False, "TYPE_MISMATCH", datum=1),
    Case(
        "nested record gains a required field",
        record("Outer", f("inner", record("Inner", f("a", "int")))),
        record("Outer", f("inner", record("Inner", f("a", "int"), f("b", "string")))),
        False,
        "READER_FIELD_MISSING_DEFAULT_VALUE",
        datum={"inner": {"a": 1}},
    ),
    Case(
        "named type referenced twice",
        record("Pair", f("left", record("Point", f("x", "int"))), f("right", "Point")),
        record("Pair", f("left", record("Point", f("x", "long"))), f("right", "Point")),
        True,
        datum={"left": {"x": 1}, "right": {"x": 2}},
    ),
    Case(
        "array of records, field without default",
        {"type": "array", "items": record("Item", f("a", "int"))},
        {"type": "array", "items": record("Item", f("a", "int"), f("b", "int"))},
        False,
        "READER_FIELD_MISSING_DEFAULT_VALUE",
        datum=[{"a": 1}],
    ),
    Case(
        "recursive type",
        record("Node", f("v", "int"), f("next", ["null", "Node"], default=None)),
        record("Node", f("v", "long"), f("next", ["null", "Node"], default=None)),
        True,
        datum={"v": 1, "next": {"v": 2, "next": None}},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_resolution(case: Case) -> None:
    found = incompatibilities(case.reader, case.writer)
    assert can_read(case.reader, case.writer) is case.compatible, found
    if case.kind is not None:
        assert case.kind in {i.kind for i in found}


WITH_DATUM = [c for c in CASES if c.datum is not NO_DATUM]


@pytest.mark.parametrize("case", WITH_DATUM, ids=[c.id for c in WITH_DATUM])
def test_fastavro_agrees(case: Case) -> None:
    """The verdict matches what an Avro library does with a datum written by the writer."""
    # Both schemas must parse: a parse error is a broken case, not an incompatibility.
    writer, reader = parse_schema(case.writer), parse_schema(case.reader)
    out = io.BytesIO()
    schemaless_writer(out, writer, case.datum)
    out.seek(0)
    try:
        schemaless_reader(out, writer, reader)
        read = True
    except SchemaResolutionError:  # only the reader failing to resolve the writer's data
        read = False
    assert read is case.compatible


def test_a_missing_field_names_the_field_and_its_path() -> None:
    [problem] = incompatibilities(
        record("P", f("id", "string"), f("email", "string")), record("P", f("id", "string"))
    )
    assert problem.path == "/fields/1"
    assert '"email"' in problem.message and "no default" in problem.message


def test_levels_check_the_direction_they_name() -> None:
    old = record("P", f("id", "string"))
    added_required = record("P", f("id", "string"), f("n", "int"))
    dropped = record("P")
    assert level_incompatibilities("BACKWARD", added_required, old)
    assert not level_incompatibilities("FORWARD", added_required, old)
    assert not level_incompatibilities("BACKWARD", dropped, old)
    assert level_incompatibilities("FORWARD", dropped, old)
    assert level_incompatibilities("FULL", dropped, old)
    assert level_incompatibilities("FULL_TRANSITIVE", added_required, old)
    assert not level_incompatibilities("NONE", added_required, old)
    with_default = record("P", f("id", "string"), f("n", "int", default=0))
    assert all(not level_incompatibilities(level, with_default, old) for level in LEVELS)
    with pytest.raises(ValueError, match="BACKWARD"):
        level_incompatibilities("SIDEWAYS", old, old)


def test_an_unknown_named_type_is_a_structure_error() -> None:
    with pytest.raises(SchemaStructureError, match="Nope"):
        incompatibilities(record("P", f("x", "Nope")), "int")
