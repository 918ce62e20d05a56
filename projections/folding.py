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

import io
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.json as pj  # type: ignore[import-untyped]

FOLDED_SCHEMA = pa.schema(
    [
        ("collection", pa.string()),
        ("key", pa.string()),
        ("position", pa.int64()),
        ("deleted", pa.bool_()),
        ("fields", pa.string()),
        ("member", pa.string()),
        ("changes", pa.list_(pa.int64())),
        ("fresh", pa.bool_()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("error", pa.string()),
        ("raw_key", pa.binary()),
        ("raw_value", pa.binary()),
    ]
)

FOLDED_DDL = (
    "collection string, key string, position long, deleted boolean, fields string,"
    " member string, changes array<long>, fresh boolean, topic string, partition int,"
    " offset long, error string, raw_key binary, raw_value binary"
)


def records_table(batches: Iterable[pa.RecordBatch]) -> pa.Table:
    """One partition's records (Kafka source columns) as a table."""
    chunks = list(batches)
    if not chunks:
        return pa.table({"key": pa.array([], pa.binary())})
    return pa.Table.from_batches(chunks)


def header_values(headers: pa.ChunkedArray | pa.Array, name: str) -> pa.Array:
    """The value of header ``name`` per record as text (null where absent)."""
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
    reason per bad row index. The fast path parses all values in one call; only when that fails
    is each value parsed alone to find the bad ones.
    """
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    present = pc.is_valid(values).to_numpy(zero_copy_only=False)
    if not present.any():
        return None, {}
    try:
        parsed = pj.read_json(io.BytesIO(json_lines(values)), parse_options=options)
        if parsed.num_rows == int(present.sum()):  # else a blank value vanished: slow path
            return _align(parsed, present, schema), {}
    except (pa.ArrowInvalid, UnicodeDecodeError):
        pass
    bad: dict[int, str] = {}
    good = present.copy()
    raw = values.to_pylist()
    for index, value in enumerate(raw):
        if value is None:
            continue
        problem = _json_problem(value, options)
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


def _json_problem(value: bytes, options: Any) -> str | None:
    import json

    if not value.strip():
        return "is not JSON: empty value"
    if b"\n" in value or b"\r" in value:
        try:
            json.loads(value)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return f"is not JSON: {exc}"
        value = value.replace(b"\r", b" ").replace(b"\n", b" ")
    try:
        pj.read_json(io.BytesIO(value), parse_options=options)
    except pa.ArrowInvalid as exc:
        try:
            parsed = json.loads(value)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            return f"is not JSON: {err}"
        if not isinstance(parsed, dict):
            return "is not a JSON object"
        return f"does not have the expected shape: {exc}"
    return None


def _align(parsed: pa.Table, present: np.ndarray, schema: pa.Schema) -> pa.Table:
    """Spread rows parsed from the present values back to every index (nulls elsewhere)."""
    if present.all():
        return parsed
    positions = np.cumsum(present) - 1
    take = pa.array(np.where(present, positions, -1))
    take = pc.if_else(pc.greater_equal(take, 0), take, pa.scalar(None, pa.int64()))
    return pa.table({name: parsed.column(name).take(take) for name in schema.names})


def rejections(table: pa.Table, reasons: dict[int, str], prefix: str = "") -> pa.RecordBatch | None:
    """Rejection rows for the records at ``reasons``' indices."""
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
        schema=FOLDED_SCHEMA,
    )


def _column(table: pa.Table, name: str, index: pa.Array, kind: pa.DataType) -> pa.Array:
    return table.column(name).take(index).combine_chunks().cast(kind)


def folded_batch(columns: dict[str, Any], n: int) -> pa.RecordBatch:
    """A batch of folded rows from the given columns (absent ones are null)."""
    arrays = []
    for field in FOLDED_SCHEMA:
        value = columns.get(field.name)
        if value is None:
            arrays.append(pa.nulls(n, field.type))
        elif isinstance(value, pa.ChunkedArray):
            arrays.append(value.combine_chunks().cast(field.type))
        elif isinstance(value, pa.Array):
            arrays.append(value.cast(field.type))
        else:
            arrays.append(pa.array(value, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=FOLDED_SCHEMA)


def emit(parts: Sequence[pa.RecordBatch | None]) -> Iterator[pa.RecordBatch]:
    """Yield the non-empty batches (a mapInArrow function's output)."""
    for part in parts:
        if part is not None and part.num_rows:
            yield part
