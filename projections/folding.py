"""The shape every view's fold produces, and the columnar helpers folds share.

A view's fold runs on Spark's executors, one Kafka partition's records at a time (keys never
span partitions), and turns them into at most one *folded row* per key - or a *rejection* for a
record it cannot use. Only folded rows travel to the driver, as Arrow. :data:`FOLDED_SCHEMA`:

- ``collection``, ``key``: where the write goes; ``position``: the key's newest position;
  ``deleted``: the key ends deleted; ``fields``: JSON text of the entry's fields, or of a larger
  document whose member ``member`` holds them (the Debezium envelope and ``after``);
  ``changes``: the positions folded into the write (ascending); ``fresh``: (re)created in this
  batch; ``topic``/``partition``/``offset``: the last record folded (for dead letters).
- a rejection has ``error`` set and carries the record's ``raw_key``/``raw_value``.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

from tributary.view_model import write_schema

# numpy and Arrow (~0.15 s to import) come with the first fold: the view definitions (what
# `tributary views`, `query` and `status` read) import this module without them.
if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]


@cache
def folded_schema() -> pa.Schema:
    """:data:`FOLDED_SCHEMA` (the module docstring), built at first use."""
    import pyarrow as pa

    return pa.schema(
        [
            *write_schema(),  # what the stores' write table holds, then why a record was refused
            ("error", pa.string()),
            ("raw_key", pa.binary()),
            ("raw_value", pa.binary()),
        ]
    )


@cache
def spark_types() -> dict[pa.DataType, str]:
    """The Spark SQL type of each Arrow type folds use (also ``SPARK_TYPES``)."""
    import pyarrow as pa

    return {
        pa.string(): "string",
        pa.int64(): "long",
        pa.int32(): "int",
        pa.bool_(): "boolean",
        pa.binary(): "binary",
    }


def spark_ddl(schema: pa.Schema) -> str:
    """The Spark DDL of an Arrow schema (the types folds use; lists of them as arrays)."""
    import pyarrow as pa

    types = spark_types()

    def kind(t: pa.DataType) -> str:
        if pa.types.is_list(t):
            return f"array<{kind(t.value_type)}>"
        return types[t]

    return ", ".join(f"{f.name} {kind(f.type)}" for f in schema)


#: :data:`FOLDED_SCHEMA` as Spark DDL (a unit test holds it to ``spark_ddl(folded_schema())``):
#: text, so that a view's definition has it without Arrow.
FOLDED_DDL = (
    "collection string, key string, position long, deleted boolean, fields string,"
    " member string, changes array<long>, fresh boolean, topic string, partition int,"
    " offset long, error string, raw_key binary, raw_value binary"
)

_LAZY = {"FOLDED_SCHEMA": folded_schema, "SPARK_TYPES": spark_types}


def __getattr__(name: str) -> Any:  # PEP 562: the Arrow constants, built at first use
    if name in _LAZY:
        return _LAZY[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def records_table(batches: Iterable[pa.RecordBatch]) -> pa.Table:
    """One partition's records (Kafka source columns) as a table."""
    import pyarrow as pa

    chunks = list(batches)
    if not chunks:
        return pa.table({"key": pa.array([], pa.binary())})
    return pa.Table.from_batches(chunks)


def header_values(headers: pa.ChunkedArray | pa.Array, name: str) -> pa.Array:
    """The value of header ``name`` per record as text (null where absent)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    n = len(headers)
    out = np.full(n, None, dtype=object)
    if n == 0 or headers.null_count == n:
        return pa.array(out, pa.string())
    flat = pc.list_flatten(headers)
    parents = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
    mask = pc.equal(flat.field("key"), name).fill_null(False).to_numpy(zero_copy_only=False)
    values = flat.field("value").filter(pa.array(mask)).to_pylist()
    for row, value in zip(parents[mask], values, strict=True):
        out[row] = None if value is None else value.decode("ascii", "replace")
    return pa.array(out, pa.string())


def json_lines(values: pa.Array) -> bytes:
    """Non-null binary values joined with newlines (the input of ``pyarrow.json``), built
    from the array's buffers without a Python object per value."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    present = values.filter(pc.is_valid(values)) if values.null_count else values
    count = len(present)
    if count == 0:
        return b""
    present = present.cast(pa.large_binary())
    offsets = np.frombuffer(present.buffers()[1], dtype=np.int64)[
        present.offset : present.offset + count + 1
    ]
    data = present.buffers()[2]
    body = (
        np.frombuffer(data, dtype=np.uint8)[offsets[0] : offsets[-1]]
        if data is not None
        else np.empty(0, np.uint8)
    )
    out = np.full(len(body) + count, ord("\n"), dtype=np.uint8)
    keep = np.ones(len(out), dtype=bool)
    keep[(offsets[1:] - offsets[0]) + np.arange(count)] = False
    out[keep] = body
    return out[:-1].tobytes()


def parse_json(values: pa.Array, schema: pa.Schema) -> tuple[pa.Table | None, dict[int, str]]:
    """Parse each non-null value as a JSON object with ``schema`` (other fields ignored).

    Returns the parsed rows aligned with ``values`` (nulls where a value is null or bad) and the
    reason per bad row index. The fast path parses all values in one ``pyarrow.json`` call; it
    is taken only when every value is one object on one line (``pyarrow.json`` crashes on some
    other inputs, e.g. a bare ``null``). Otherwise each value is checked in Python first, and
    only the well-formed ones reach ``pyarrow.json``.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj  # type: ignore[import-untyped]

    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    present = pc.is_valid(values).to_numpy(zero_copy_only=False)
    if not present.any():
        return None, {}
    if _plain_objects(values):
        try:
            parsed = pj.read_json(io.BytesIO(json_lines(values)), parse_options=options)
            if parsed.num_rows == int(present.sum()):
                return _align(parsed, present, schema), {}
        except (pa.ArrowInvalid, UnicodeDecodeError):
            pass
    bad: dict[int, str] = {}
    good = present.copy()
    raw = values.to_pylist()
    for index, value in enumerate(raw):
        if value is None:
            continue
        problem = shape_problem(value, schema)
        if problem is not None:
            bad[index] = problem
            good[index] = False
    if not good.any():
        return None, bad
    lines = b"\n".join(
        v.replace(b"\r", b" ").replace(b"\n", b" ") for v, ok in zip(raw, good, strict=True) if ok
    )
    parsed = pj.read_json(io.BytesIO(lines), parse_options=options)
    return _align(parsed, good, schema), bad


def _plain_objects(values: pa.Array) -> bool:
    """Whether every non-null value starts with ``{``, ends with ``}`` and has no line break."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    present = values.filter(pc.is_valid(values)) if values.null_count else values
    if len(present) == 0:
        return True
    present = present.cast(pa.large_binary())
    offsets = np.frombuffer(present.buffers()[1], dtype=np.int64)[
        present.offset : present.offset + len(present) + 1
    ]
    if (np.diff(offsets) < 2).any():
        return False
    data = np.frombuffer(present.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    starts, ends = offsets[:-1] - offsets[0], offsets[1:] - offsets[0] - 1
    return bool(
        (data[starts] == ord("{")).all()
        and (data[ends] == ord("}")).all()
        and not (data == ord("\n")).any()
        and not (data == ord("\r")).any()
    )


def shape_problem(value: bytes, schema: pa.Schema) -> str | None:
    """Why ``value`` is not a JSON object whose fields fit ``schema`` (None: it fits)."""
    import json

    try:
        parsed = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"is not JSON: {exc}" if value.strip() else "is not JSON: empty value"
    if not isinstance(parsed, dict):
        return "is not a JSON object"
    for field in schema:
        problem = _type_problem(parsed.get(field.name), field.type, field.name)
        if problem is not None:
            return f"does not have the expected shape: {problem}"
    return None


def _type_problem(value: Any, kind: pa.DataType, path: str) -> str | None:
    import pyarrow as pa

    if value is None:
        return None
    if pa.types.is_struct(kind):
        if not isinstance(value, dict):
            return f"{path} is not an object"
        for child in kind:
            problem = _type_problem(value.get(child.name), child.type, f"{path}.{child.name}")
            if problem is not None:
                return problem
        return None
    if pa.types.is_integer(kind):
        ok = isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63
        return None if ok else f"{path} is not an integer"
    if pa.types.is_string(kind):
        return None if isinstance(value, str) else f"{path} is not a string"
    if pa.types.is_boolean(kind):
        return None if isinstance(value, bool) else f"{path} is not a boolean"
    if pa.types.is_list(kind):
        if not isinstance(value, list):
            return f"{path} is not a list"
        for item in value:
            problem = _type_problem(item, kind.value_type, f"{path}[]")
            if problem is not None:
                return problem
        return None
    return None


def _align(parsed: pa.Table, present: np.ndarray, schema: pa.Schema) -> pa.Table:
    """Spread rows parsed from the present values back to every index (nulls elsewhere)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if present.all():
        return parsed
    positions = np.cumsum(present) - 1
    take = pa.array(np.where(present, positions, -1))
    take = pc.if_else(pc.greater_equal(take, 0), take, pa.scalar(None, pa.int64()))
    return pa.table({name: parsed.column(name).take(take) for name in schema.names})


def rejections(table: pa.Table, reasons: dict[int, str], prefix: str = "") -> pa.RecordBatch | None:
    """Rejection rows for the records at ``reasons``' indices."""
    import pyarrow as pa

    if not reasons:
        return None
    rows = sorted(reasons)
    index = pa.array(rows, pa.int64())
    n = len(rows)
    return pa.RecordBatch.from_arrays(
        [
            pa.nulls(n, pa.string()),
            pa.nulls(n, pa.string()),
            pa.nulls(n, pa.int64()),
            pa.nulls(n, pa.bool_()),
            pa.nulls(n, pa.string()),
            pa.nulls(n, pa.string()),
            pa.nulls(n, pa.list_(pa.int64())),
            pa.nulls(n, pa.bool_()),
            _column(table, "topic", index, pa.string()),
            _column(table, "partition", index, pa.int32()),
            _column(table, "offset", index, pa.int64()),
            pa.array([prefix + reasons[i] for i in rows], pa.string()),
            _column(table, "key", index, pa.binary()),
            _column(table, "value", index, pa.binary()),
        ],
        schema=folded_schema(),
    )


def _column(table: pa.Table, name: str, index: pa.Array, kind: pa.DataType) -> pa.Array:
    return table.column(name).take(index).combine_chunks().cast(kind)


def folded_batch(columns: dict[str, Any], n: int) -> pa.RecordBatch:
    """A batch of folded rows from the given columns (absent ones are null)."""
    import pyarrow as pa

    arrays = []
    for field in folded_schema():
        value = columns.get(field.name)
        if value is None:
            arrays.append(pa.nulls(n, field.type))
        elif isinstance(value, pa.ChunkedArray):
            arrays.append(value.combine_chunks().cast(field.type))
        elif isinstance(value, pa.Array):
            arrays.append(value.cast(field.type))
        else:
            arrays.append(pa.array(value, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=folded_schema())


def emit(parts: Sequence[pa.RecordBatch | None]) -> Iterator[pa.RecordBatch]:
    """Yield the non-empty batches (a mapInArrow function's output)."""
    for part in parts:
        if part is not None and part.num_rows:
            yield part
