"""The mirror view: the latest row per primary key of a CDC topic; deletes remove the row.

:func:`fold_changes` folds one Kafka partition's Debezium records, columnar (``pyarrow.json``
parses the envelopes, ``group_by`` folds per key), into one write per key: the newest change by
position (LSN) wins; the positions of the key's live changes since its last insert in the batch
are kept, so the store can count exactly how many changes built each row. Records that are not
Debezium changes become rejections with the reason. Only the winning envelope's text travels
on; the store reads the row from its ``after`` member.

:func:`mirror_table` turns the source table's catalog into the mirror's typed layout: each
column keeps its SQL type, and says how Debezium encoded its values in JSON (with this
project's connector settings: ``decimal.handling.mode=string``,
``time.precision.mode=adaptive_time_microseconds``, bytes as base64).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from connectors.debezium import debezium_encoding
from connectors.postgres import SourceColumn
from projections.folding import (
    emit,
    folded_batch,
    header_values,
    parse_json,
    records_table,
    rejections,
)

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]

    # (the table's module imports psycopg, which Spark's workers do not need)
    from connectors.stores.pg_tables import TypedTable

ROWS = "rows"
_OPS = {"c", "u", "d", "r"}


@cache
def envelope_schema() -> pa.Schema:
    """What the fold reads of a Debezium envelope (also ``ENVELOPE``): built at first use, so
    that the mirror's definition (`tributary views`, `status`) does without Arrow."""
    import pyarrow as pa

    return pa.schema(
        [
            ("op", pa.string()),
            ("after", pa.struct([])),
            ("source", pa.struct([("lsn", pa.int64()), ("sequence", pa.string())])),
        ]
    )


@cache
def key_schema() -> pa.Schema:
    """A record key: any JSON object (also ``KEY``)."""
    import pyarrow as pa

    return pa.schema([])


_LAZY = {"ENVELOPE": envelope_schema, "KEY": key_schema}


def __getattr__(name: str) -> Any:  # PEP 562: the Arrow schemas, built at first use
    if name in _LAZY:
        return _LAZY[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def fold_changes(
    batches: Iterable[pa.RecordBatch], collection: str = ROWS
) -> Iterator[pa.RecordBatch]:
    """One partition's Debezium records -> one folded row per key, plus rejections."""
    import numpy as np

    table = records_table(batches)
    if table.num_rows == 0:
        return
    changes = decode_changes(table)
    usable = ~np.isnan(changes.position)
    if changes.reasons:
        usable[list(changes.reasons)] = False
    yield from emit([_fold(table, changes, usable, collection), rejections(table, changes.reasons)])


@dataclass
class DecodedChanges:
    """Per record: position (NaN: none), deleted (a delete or a tombstone), created (an insert
    or a snapshot read), and why a record is rejected."""

    position: np.ndarray
    deleted: np.ndarray
    created: np.ndarray
    reasons: dict[int, str]


def _flags(values: pa.Array, members: list[str]) -> np.ndarray:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    found = pc.fill_null(pc.is_in(values, pa.array(members)), False)
    return np.asarray(found.to_numpy(zero_copy_only=False), dtype=bool)


def decode_changes(table: pa.Table) -> DecodedChanges:
    """Decode keys and envelopes of a partition's records: columnar, with a slow path that
    names each bad record."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows
    keys = table.column("key").combine_chunks()
    values = table.column("value").combine_chunks()
    reasons: dict[int, str] = {}
    for row in map(int, np.flatnonzero(~pc.is_valid(keys).to_numpy(zero_copy_only=False))):
        reasons[row] = "change without a key (tables need a primary key)"
    _, bad_keys = parse_json(keys, key_schema())
    for index, reason in bad_keys.items():
        reasons.setdefault(index, f"key {reason}")
    parsed, bad_values = parse_json(values, envelope_schema())
    for index, reason in bad_values.items():
        reasons.setdefault(index, f"value {reason}")
    tombstone = ~pc.is_valid(values).to_numpy(zero_copy_only=False)
    position = np.full(n, np.nan)
    deleted = tombstone.copy()
    created = np.zeros(n, dtype=bool)
    if parsed is not None:
        ops = parsed.column("op").combine_chunks()
        source = parsed.column("source").combine_chunks()
        lsn = pc.cast(source.field("lsn"), pa.float64())
        position = pc.fill_null(lsn, np.nan).to_numpy(zero_copy_only=False).copy()
        sequence = source.field("sequence")
        for row in map(
            int,
            np.flatnonzero(
                np.isnan(position) & pc.is_valid(sequence).to_numpy(zero_copy_only=False)
            ),
        ):
            position[row] = _sequence_position(sequence[row].as_py())
        known = _flags(ops, sorted(_OPS))
        deleted |= _flags(ops, ["d"])
        created = _flags(ops, ["c", "r"])
        after_ok = pc.is_valid(parsed.column("after")).to_numpy(zero_copy_only=False)
        candidate = ~tombstone
        if reasons:
            candidate[list(reasons)] = False
        for row in map(int, np.flatnonzero(candidate & ~known)):
            op = ops[row].as_py()
            if op in ("t", "m"):
                reasons[row] = f"op {op!r} does not change a row; cannot mirror it"
            else:
                reasons[row] = f"envelope has no valid op (got {op!r})"
        for row in map(int, np.flatnonzero(candidate & known & np.isnan(position))):
            reasons[row] = "envelope has no source.lsn"
        missing_after = candidate & known & ~np.isnan(position) & ~deleted & ~after_ok
        for row in map(int, np.flatnonzero(missing_after)):
            reasons[row] = f"op {ops[row].as_py()!r} without an 'after' row object"
    if tombstone.any():
        lsn_header = header_values(table.column("headers"), "lsn").to_pylist()
        for row in map(int, np.flatnonzero(tombstone)):
            text = lsn_header[row]
            if text is not None and text.isdigit():
                position[row] = float(int(text))
    return DecodedChanges(position, deleted, created & ~deleted, reasons)


def _sequence_position(sequence: str) -> float:
    """Incremental-snapshot reads carry no LSN: the larger LSN of ``source.sequence``."""
    import numpy as np

    try:
        items = json.loads(sequence)
    except json.JSONDecodeError:
        return np.nan
    known = [int(x) for x in items if x is not None] if isinstance(items, list) else []
    return float(max(known)) if known else np.nan


def _fold(
    table: pa.Table, changes: DecodedChanges, usable: np.ndarray, collection: str
) -> pa.RecordBatch | None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = np.flatnonzero(usable)
    if rows.size == 0:
        return None
    take = pa.array(rows)
    position = changes.position[rows].astype(np.int64)
    deleted = changes.deleted[rows]
    created = changes.created[rows]
    frame = pa.table(
        {
            "k": table.column("key").take(take).cast(pa.string()),
            "pos": position,
            "offset": table.column("offset").take(take),
            "row": rows,
            "created": pa.array(np.where(created, position, 0), mask=~created),
            "live": pa.array(np.where(deleted, 0, position), mask=deleted),
        }
    ).sort_by([("pos", "ascending"), ("offset", "ascending")])
    folded = frame.group_by("k", use_threads=False).aggregate(
        [("pos", "max"), ("row", "last"), ("created", "max"), ("live", "distinct")]
    )
    winner = folded.column("row_last").combine_chunks()
    gone = pa.array(changes.deleted[winner.to_numpy(zero_copy_only=False)])
    created_at = folded.column("created_max").combine_chunks()
    since = pc.fill_null(created_at, -1).to_numpy(zero_copy_only=False)
    positions = _changes_since(folded.column("live_distinct").combine_chunks(), since)
    fields = table.column("value").take(winner).cast(pa.string())
    nothing = pa.scalar(None, pa.string())
    n = folded.num_rows
    return folded_batch(
        {
            "collection": pa.array(np.full(n, collection, dtype=object), pa.string()),
            "key": folded.column("k"),
            "position": folded.column("pos_max"),
            "deleted": gone,
            "fields": pc.if_else(gone, nothing, fields),
            "member": pc.if_else(gone, nothing, "after"),
            "changes": positions,
            "fresh": pc.is_valid(created_at),
            "topic": table.column("topic").take(winner),
            "partition": table.column("partition").take(winner),
            "offset": table.column("offset").take(winner),
        },
        n,
    )


def _changes_since(lists: pa.ListArray, since: np.ndarray) -> pa.ListArray:
    """Per key, its distinct live positions at or after ``since`` (its last insert), sorted."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    flat = pc.list_flatten(lists).to_numpy(zero_copy_only=False)
    parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    keep = flat >= since[parents]
    flat, parents = flat[keep], parents[keep]
    order = np.lexsort((flat, parents))
    flat, parents = flat[order], parents[order]
    counts = np.bincount(parents, minlength=len(lists))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.int64()))


# -- the mirror's table, from the source's catalog ------------------------------------------


def mirror_table(
    table: str,
    catalog: Callable[[], Sequence[SourceColumn]],
    collection: str = ROWS,
) -> TypedTable:
    """The mirror's typed layout: the source's columns, types and primary key, read from the
    source's catalog when the store first needs them, and again whenever a change carries a
    column the mirror lacks."""
    from connectors.stores.pg_tables import TypedColumn, TypedTable

    def layout() -> TypedTable:
        columns = catalog()
        return TypedTable(
            collection=collection,
            table=table,
            columns=tuple(TypedColumn(c.name, c.sql_type, debezium_encoding(c)) for c in columns),
            key=tuple(c.name for c in columns if c.primary_key),
            refresh=layout,
        )

    return TypedTable(collection=collection, table=table, columns=(), key=(), refresh=layout)
