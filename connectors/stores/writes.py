"""A batch's writes as columns, and the position guard over them (written once, vectorised).

:class:`WriteColumns` wraps the write table (:data:`~tributary.view_model.WRITE_SCHEMA`)
with the numpy columns the stores work on: positions, deletes, fresh flags and the positions
of the folded changes (null or empty normalised to ``[position]``). No Python object per write
is made unless a caller asks for one (:meth:`WriteColumns.write`, for a materializer's
``Applied`` or a ``Rejected``).

:func:`guard` is the per-key position guard and the applied counts of
:func:`~tributary.view_model.applied_count`, for a whole batch at once: a write passes
when its position is above the key's *floor* (the larger of the stored entry's position and
the deleted key's tombstone position); its entry's applied count adds the folded changes above
the floor, or restarts from them when the write is fresh and its first change is new.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Self

from tributary.view_model import (
    Delete,
    Entry,
    JsonObject,
    Put,
    SourceRef,
    Write,
    fields_json,
    write_schema,
    write_table,
)

# numpy and Arrow (~0.15 s to import) come with the first batch: a store's read side (its
# ledger, its queries) imports this module without them.
if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]

NONE = -(2**63)  # numpy.iinfo(numpy.int64).min
"""A position that is not there (no stored entry, no tombstone) in the guard's columns."""

_REQUIRED = ("collection", "key", "position")


@dataclass(frozen=True)
class Staged:
    """An entry as a materializer's unit sees it (the Kafka and Redis stores' pending and
    stored entries): parsed fields, their exact JSON, position, applied count."""

    fields: Mapping[str, Any]
    text: str
    position: int
    applied: int

    @classmethod
    def of(cls, fields: Mapping[str, Any], position: int, applied: int) -> Self:
        text = fields_json(fields)
        parsed = json.loads(text)
        if not isinstance(parsed, dict):
            raise ValueError(f"fields must be a JSON object, got {text[:80]!r}")
        return cls(parsed, text, position, applied)

    def entry(self, collection: str, key: str) -> Entry:
        return Entry(collection, key, json.loads(self.text), self.position, self.applied)


def conform(table: pa.Table | pa.RecordBatch) -> pa.Table:
    """``table`` with exactly the write table's columns and types (missing optional columns
    null); ValueError naming what is wrong when a required column is missing or null."""
    import pyarrow as pa

    schema = write_schema()
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    n = table.num_rows
    columns = []
    for field in schema:
        if field.name in table.column_names:
            column = table[field.name]
            if column.type != field.type:
                try:
                    column = column.cast(field.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise ValueError(
                        f"write table: column {field.name} is {column.type}, not {field.type}"
                    ) from exc
        elif field.name in _REQUIRED:
            raise ValueError(f"write table: no column {field.name}")
        else:
            column = pa.nulls(n, field.type)
        if field.name in _REQUIRED and column.null_count:
            raise ValueError(f"write table: column {field.name} holds nulls")
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema).combine_chunks()


def _flags(column: pa.ChunkedArray) -> np.ndarray:
    import numpy as np

    return np.asarray(column.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


class WriteColumns:
    """A batch's writes as columns (see the module docstring)."""

    def __init__(self, table: pa.Table | pa.RecordBatch) -> None:
        import numpy as np

        self.table = conform(table)
        self.n = self.table.num_rows
        self.position = np.asarray(self.table["position"].to_numpy(), dtype=np.int64)
        self.deleted = _flags(self.table["deleted"])
        self.fresh = _flags(self.table["fresh"]) & ~self.deleted
        coded = self.table["collection"].combine_chunks().dictionary_encode()
        self.collections: list[str] = coded.dictionary.to_pylist()
        self.collection_codes = np.asarray(coded.indices.to_numpy(), dtype=np.int64)
        self.change_offsets, self.change_values = self._changes()
        self._keys: list[str] | None = None

    @classmethod
    def of(cls, writes: Sequence[Write] | pa.Table | pa.RecordBatch) -> WriteColumns:
        """The columns of a batch's writes, given as the write table or as Put/Delete objects."""
        import pyarrow as pa

        if isinstance(writes, pa.Table | pa.RecordBatch):
            return cls(writes)
        return cls(write_table(list(writes)))

    def _changes(self) -> tuple[np.ndarray, np.ndarray]:
        """Offsets and values of each row's changes, null or empty as ``[position]``."""
        import numpy as np
        import pyarrow.compute as pc  # type: ignore[import-untyped]

        changes = self.table["changes"].combine_chunks()
        lengths = np.asarray(
            pc.list_value_length(changes).fill_null(0).to_numpy(zero_copy_only=False),
            dtype=np.int64,
        )
        flat = np.asarray(pc.list_flatten(changes).to_numpy(zero_copy_only=False), np.int64)
        sizes = np.where(lengths == 0, 1, lengths)
        offsets = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        values = np.empty(int(offsets[-1]), dtype=np.int64)
        if len(flat):
            parent = np.repeat(np.arange(self.n), lengths)
            starts = np.zeros(self.n, dtype=np.int64)
            np.cumsum(lengths[:-1], out=starts[1:])
            values[offsets[:-1][parent] + np.arange(len(flat)) - starts[parent]] = flat
        empty = lengths == 0
        values[offsets[:-1][empty]] = self.position[empty]
        return offsets, values

    # -- rows ----------------------------------------------------------------------------

    @property
    def keys(self) -> list[str]:
        """The keys as Python strings (made once, for stores that send keys one by one)."""
        if self._keys is None:
            self._keys = self.table["key"].to_pylist()
        return self._keys

    def rows_of(self, collection: str) -> np.ndarray:
        """The rows of one collection, in batch order."""
        import numpy as np

        try:
            code = self.collections.index(collection)
        except ValueError:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self.collection_codes == code)

    def column(self, name: str, rows: np.ndarray | None = None) -> list[Any]:
        """A column's values as Python objects (of ``rows``: all when None)."""
        import pyarrow as pa

        column = self.table[name]
        if rows is not None:
            column = column.take(pa.array(rows, pa.int64()))
        return list(column.to_pylist())

    def check_unique(self) -> None:
        """At most one write per key of a collection (the fold folds per key): the keys'
        hashes are compared first, the keys themselves only where two hashes are equal."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from connectors.stores.positions import key_hashes

        if self.n == 0:
            return
        hashes = key_hashes(self.table["key"])
        for code, collection in enumerate(self.collections):
            rows = np.flatnonzero(self.collection_codes == code)
            ordered = np.sort(hashes[rows])
            if not np.any(ordered[1:] == ordered[:-1]):
                continue
            keys = self.table["key"].take(pa.array(rows, pa.int64()))
            counted = pa.table({"k": keys}).group_by("k").aggregate([([], "count_all")])
            twice = counted.filter(pc.greater(counted["count_all"], 1))
            if twice.num_rows:
                key = twice["k"][0].as_py()
                raise ValueError(f"two writes for {collection}/{key} in one batch")

    def folded(self, row: int) -> tuple[int, ...]:
        start, end = self.change_offsets[row], self.change_offsets[row + 1]
        return tuple(int(p) for p in self.change_values[start:end])

    def write(self, row: int) -> Write:
        """Row ``row`` as a Put/Delete object (fields as a lazily parsed JSON object)."""
        return self.writes([row])[0]

    def writes(self, rows: Sequence[int] | np.ndarray) -> list[Write]:
        """Rows as Put/Delete objects (one Arrow read for all of them)."""
        import numpy as np
        import pyarrow as pa

        taken = self.table.take(pa.array(np.asarray(rows, dtype=np.int64), pa.int64()))
        return [_write_of(r) for r in taken.to_pylist()]


def _write_of(r: dict[str, Any]) -> Write:
    source = None
    if r["topic"] is not None or r["partition"] is not None or r["offset"] is not None:
        source = SourceRef(r["topic"] or "", int(r["partition"] or 0), int(r["offset"] or 0))
    if r["deleted"]:
        return Delete(r["collection"], r["key"], int(r["position"]), source)
    if r["fields"] is None:
        raise ValueError(f"write table: the Put of {r['collection']}/{r['key']} has no fields")
    return Put(
        r["collection"],
        r["key"],
        int(r["position"]),
        JsonObject(r["fields"], r["member"]),
        tuple(r["changes"] or ()),
        bool(r["fresh"]),
        source,
    )


# -- the guard ------------------------------------------------------------------------------


def guard(
    writes: WriteColumns,
    stored: np.ndarray,
    applied: np.ndarray,
    tomb: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Which writes pass the position guard, and each entry's applied count after its write.

    ``stored``/``applied``: the stored entry's position and count per row (:data:`NONE`
    position: no entry); ``tomb``: the deleted key's position (:data:`NONE`: no tombstone).
    """
    import numpy as np

    floor = np.maximum(stored, tomb)
    known = floor != NONE
    passed = ~known | (writes.position > floor)
    floor_c = np.where(known, floor, -1)
    lengths = np.diff(writes.change_offsets)
    parent = np.repeat(np.arange(writes.n), lengths)
    newer = writes.change_values > floor_c[parent]
    new = np.bincount(parent[newer], minlength=writes.n).astype(np.int64)
    first = writes.change_values[writes.change_offsets[:-1]] if writes.n else new
    restart = writes.fresh & (first > floor_c)
    base = np.where(stored == NONE, 0, applied)
    counts = np.where(restart, new, base + new)
    return passed, counts


# -- entry texts ----------------------------------------------------------------------------


def _member_text(text: str, member: str | None) -> tuple[str, dict[str, Any]]:
    """The entry's JSON text and fields from a row's text and member (ValueError, TypeError)."""
    if member is None:
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError(f"fields must be a JSON object, got {text[:80]!r}")
        return text, value
    fields = dict(JsonObject(text, member))
    return json.dumps(fields, separators=(",", ":"), default=str), fields


def entry_objects(
    writes: WriteColumns, rows: np.ndarray
) -> tuple[list[str | None], list[dict[str, Any] | None], dict[int, str]]:
    """For Put ``rows``: the exact JSON text of each entry's fields (a member taken out of its
    document), the fields parsed, and the rows whose fields are not a JSON object (row ->
    reason). Deletes and refused rows get None."""
    texts = writes.column("fields", rows)
    members = writes.column("member", rows)
    out_text: list[str | None] = [None] * len(rows)
    out_fields: list[dict[str, Any] | None] = [None] * len(rows)
    errors: dict[int, str] = {}
    deleted = writes.deleted[rows]
    for i, (text, member) in enumerate(zip(texts, members, strict=True)):
        if deleted[i]:
            continue
        if text is None:
            errors[int(rows[i])] = "ValueError: a Put without fields"
            continue
        try:
            out_text[i], out_fields[i] = _member_text(text, member)
        except (TypeError, ValueError) as exc:
            errors[int(rows[i])] = f"{type(exc).__name__}: {exc}"
    return out_text, out_fields, errors


def _lines(texts: pa.Array) -> bytes:
    """The texts, each followed by a newline, in one buffer (Arrow's element-wise join: no
    Python object and no index array per byte)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    joined = pc.binary_join_element_wise(texts, "", "\n").cast(pa.large_string())
    n = len(joined)
    if n == 0:
        return b""
    offsets = np.frombuffer(joined.buffers()[1], dtype=np.int64)
    start, end = int(offsets[joined.offset]), int(offsets[joined.offset + n])
    data = joined.buffers()[2]
    return b"" if data is None else data.slice(start, end - start).to_pybytes()


@cache
def _objects() -> Any:
    """Arrow's JSON reader options of :func:`_all_objects`."""
    import pyarrow as pa
    import pyarrow.json as pj  # type: ignore[import-untyped]

    return pj.ParseOptions(
        explicit_schema=pa.schema([]), unexpected_field_behavior="ignore", newlines_in_values=False
    )


def _all_objects(texts: pa.Array) -> bool:
    """Whether every text is one JSON object (checked in bulk by Arrow's JSON reader; False
    also when the bulk check cannot tell, e.g. a text spanning lines)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    if len(texts) == 0:
        return True
    if pc.any(pc.match_substring(texts, "\n")).as_py():
        return False
    try:
        parsed = pj.read_json(io.BytesIO(_lines(texts)), parse_options=_objects())
    except (pa.ArrowInvalid, ValueError):
        return False
    return bool(parsed.num_rows == len(texts))


def entry_texts(writes: WriteColumns, rows: np.ndarray) -> tuple[list[str | None], dict[int, str]]:
    """For Put ``rows``: the exact JSON text of each entry's fields and the rows whose fields
    are not a JSON object; only rows with a member, or a batch the bulk check refuses, are
    parsed one by one. Deletes get None."""
    import numpy as np
    import pyarrow as pa

    take = pa.array(rows, pa.int64())
    texts = writes.table["fields"].combine_chunks().take(take)
    members = writes.table["member"].combine_chunks().take(take)
    deleted = writes.deleted[rows]
    plain = ~deleted & np.asarray(members.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    plain &= np.asarray(texts.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    out: list[str | None] = texts.to_pylist()
    errors: dict[int, str] = {}
    todo = ~deleted & ~plain  # rows with a member (or without fields)
    if not _all_objects(texts.filter(pa.array(plain))):
        todo |= plain
    member_list = members.to_pylist()
    for i in np.flatnonzero(deleted):
        out[i] = None
    for i in np.flatnonzero(todo):
        text = out[i]
        if text is None:
            errors[int(rows[i])] = "ValueError: a Put without fields"
            continue
        try:
            out[i] = _member_text(text, member_list[i])[0]
        except (TypeError, ValueError) as exc:
            errors[int(rows[i])] = f"{type(exc).__name__}: {exc}"
            out[i] = None
    return out, errors
