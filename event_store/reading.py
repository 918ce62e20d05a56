"""Reading the log at the speed of the table: streamed pages, events decoded on use, Arrow.

A ``read_all`` page is one ``SELECT … ORDER BY transaction_id, position LIMIT n`` under
the never-skip horizon of :mod:`event_store.store`, streamed in chunks (libpq's chunked
rows mode), so PostgreSQL produces rows while the client turns earlier ones into events:
on two cores the server and the client work at the same time instead of in turn.

Rows come in binary and are loaded by psycopg's C loaders only: the event id as its 16
bytes, ``recorded_at`` as its integer microseconds, ``data`` and ``metadata`` as JSON text.
Each row becomes a :class:`~event_store.event.RecordedEvent` directly (no ORM row, no
Python loader per column), keeping id, time, JSON and position encoded until first used
(see ``RecordedEvent``); upcasting looks only at events whose type has an upcaster.

For consumers that need a few columns of many events, :func:`arrow_batch` makes one
``pyarrow.RecordBatch`` per page instead: an array per column, no event objects.
"""

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import capabilities
from psycopg.rows import RowMaker
from psycopg.types.numeric import Int8BinaryLoader
from psycopg.types.string import ByteaBinaryLoader

from event_store.event import Position, RecordedEvent
from event_store.upcasting import Upcasters

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

#: Rows per chunk while a page streams (libpq >= 17; older ones fetch the page at once).
CHUNK_ROWS = 2000

#: The events table's columns in :attr:`RecordedEvent.COLUMNS` order, as the fast path
#: selects them.
SELECT_EVENT = (
    "event_id, stream_id, stream_type, version, event_type, schema_version, "
    "data::text, metadata::text, recorded_at, transaction_id, position"
)

#: Only transactions older than every running one: that set of rows can no longer grow.
HORIZON = "transaction_id < pg_snapshot_xmin(pg_current_snapshot())::text::bigint"

#: Columns a bulk read can return: how each is selected, and its Arrow type.
BULK_COLUMNS: dict[str, tuple[str, str]] = {
    "event_id": ("event_id::text", "string"),
    "stream_id": ("stream_id", "string"),
    "stream_type": ("stream_type", "string"),
    "version": ("version", "int32"),
    "event_type": ("event_type", "string"),
    "schema_version": ("schema_version", "int32"),
    "data": ("data::text", "string"),
    "metadata": ("metadata::text", "string"),
    "recorded_at": ("recorded_at", "timestamp"),
}

_new = object.__new__
_set = object.__setattr__


def event_from_row(values: Sequence[Any]) -> RecordedEvent:
    """An event from a row of :data:`SELECT_EVENT` columns loaded by :func:`raw_loaders`."""
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
        sequence,
    ) = values
    event: RecordedEvent = _new(RecordedEvent)
    # What the frozen dataclass's __init__ would do field by field, in one dict; keys
    # with "_" hold the encoded fields (``event.ENCODED``), decoded on first access.
    _set(
        event,
        "__dict__",
        {
            "stream_id": stream_id,
            "stream_type": stream_type,
            "version": version,
            "event_type": event_type,
            "schema_version": schema_version,
            "_recorded_at": recorded_at,
            "_event_id": event_id,
            "_data": data,
            "_metadata": metadata,
            "_transaction_id": transaction_id,
            "_sequence": sequence,
        },
    )
    return event


def event_rows(cursor: Any) -> RowMaker[RecordedEvent]:
    """A psycopg row factory: :func:`event_from_row`."""
    return event_from_row


def raw_loaders(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    """Load, by C loaders, a uuid as its 16 bytes and a timestamptz as its microseconds
    (what :func:`event_from_row` keeps until first used)."""
    cursor.adapters.register_loader("uuid", ByteaBinaryLoader)
    cursor.adapters.register_loader("timestamptz", Int8BinaryLoader)


class EventQueries:
    """The read statements of one store schema (psycopg ``%(name)s`` parameters)."""

    def __init__(self, schema: str) -> None:
        self.table = f"{schema}.events"
        self.read_all = self.page(SELECT_EVENT)
        self.read_stream = (
            f"SELECT {SELECT_EVENT} FROM {self.table} WHERE stream_id = %(stream_id)s "
            "AND version >= %(from_version)s AND version <= %(to_version)s ORDER BY version"
        )

    def page(self, select: str) -> str:
        """A ``read_all`` page selecting ``select``."""
        return (
            f"SELECT {select} FROM {self.table} WHERE {HORIZON} "
            "AND (transaction_id, position) > (%(tx)s, %(seq)s) "
            "ORDER BY transaction_id, position LIMIT %(limit)s"
        )

    def bulk(self, columns: Sequence[str]) -> str:
        """A page of the named :data:`BULK_COLUMNS`, then ``transaction_id, position``."""
        select = ", ".join(BULK_COLUMNS[c][0] for c in columns)
        return self.page(f"{select}, transaction_id, position")


def page_params(after: Position | None, limit: int) -> dict[str, int]:
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    start = after or Position(-1, -1)
    return {"tx": start.transaction_id, "seq": start.sequence, "limit": limit}


def stream_params(stream_id: str, from_version: int, to_version: int | None) -> dict[str, Any]:
    top = 2**31 - 1 if to_version is None else to_version
    return {"stream_id": stream_id, "from_version": from_version, "to_version": top}


def fetch_events(
    driver: psycopg.Connection[Any], statement: str, params: dict[str, Any]
) -> list[RecordedEvent]:
    """The events a statement selecting :data:`SELECT_EVENT` returns."""
    with driver.cursor(binary=True, row_factory=event_rows) as cursor:
        raw_loaders(cursor)
        return _fetch(cursor, statement, params)


def fetch_rows(
    driver: psycopg.Connection[Any], statement: str, params: dict[str, Any]
) -> list[tuple[Any, ...]]:
    """Plain tuples (a :meth:`EventQueries.bulk` page)."""
    with driver.cursor(binary=True) as cursor:
        return _fetch(cursor, statement, params)


def _fetch(cursor: psycopg.Cursor[Any], statement: str, params: dict[str, Any]) -> list[Any]:
    """Stream a large page in chunks; run anything smaller as a (prepared) statement."""
    big = params.get("limit", 0) > CHUNK_ROWS
    if big and capabilities.has_stream_chunked() and not cursor.connection.pgconn.pipeline_status:
        return list(cursor.stream(statement, params, size=CHUNK_ROWS))
    cursor.execute(statement, params)
    return cursor.fetchall()


def upcast_all(events: list[RecordedEvent], upcasters: Upcasters | None) -> list[RecordedEvent]:
    """``events`` (in place) with upcasters applied to the events whose type has one."""
    if upcasters:
        types = upcasters.event_types
        for i, event in enumerate(events):
            if event.event_type in types:
                events[i] = upcasters.upcast(event)
    return events


# -- bulk reads: Arrow -------------------------------------------------------------------


def check_columns(columns: Sequence[str]) -> tuple[str, ...]:
    """The requested bulk columns, each once, in the given order."""
    names = tuple(dict.fromkeys(columns))
    unknown = [c for c in names if c not in BULK_COLUMNS]
    if unknown:
        raise ValueError(f"unknown columns {unknown}; choose from {', '.join(BULK_COLUMNS)}")
    return names


def selected_columns(columns: tuple[str, ...], upcasters: Upcasters | None) -> tuple[str, ...]:
    """What to select for ``columns``: upcasting a type, a version or data needs the
    stored type and version of each row, so they are selected too (and dropped later)."""
    if upcasters and {"data", "event_type", "schema_version"} & set(columns):
        extra = tuple(c for c in ("event_type", "schema_version") if c not in columns)
        return columns + extra
    return columns


def arrow_batch(
    rows: list[tuple[Any, ...]],
    selected: tuple[str, ...],
    columns: tuple[str, ...],
    upcasters: Upcasters | None,
) -> "pa.RecordBatch":
    """A record batch of ``columns`` then ``transaction_id`` and ``position`` (int64; the
    last row's pair is where the next page starts) from the rows of a ``bulk(selected)``
    page. JSON columns are UTF-8 text; with upcasters, rows whose type has one are upcast
    (only those are decoded)."""
    import pyarrow as pa

    names = (*selected, "transaction_id", "position")
    values: list[Sequence[Any]] = list(zip(*rows, strict=True)) if rows else [() for _ in names]
    if upcasters and "event_type" in selected:  # then the version is selected too
        values = [list(v) for v in values]
        _upcast_columns(dict(zip(names, values, strict=True)), upcasters)
    arrow_types = {
        "string": pa.string(),
        "int32": pa.int32(),
        "timestamp": pa.timestamp("us", tz="UTC"),
    }
    types = {n: arrow_types[BULK_COLUMNS[n][1]] for n in selected}
    types["transaction_id"] = types["position"] = pa.int64()
    kept = (*columns, "transaction_id", "position")
    by_name = dict(zip(names, values, strict=True))
    return pa.RecordBatch.from_arrays(
        [pa.array(by_name[n], types[n]) for n in kept],
        schema=pa.schema([pa.field(n, types[n], nullable=False) for n in kept]),
    )


def _upcast_columns(columns: dict[str, Any], upcasters: Upcasters) -> None:
    """Upcast, in place, the rows whose stored type has an upcaster."""
    types, versions = columns["event_type"], columns["schema_version"]
    data = columns.get("data")
    wanted = upcasters.event_types
    for row, event_type in enumerate(types):
        if event_type not in wanted:
            continue
        stored = json.loads(data[row]) if data is not None else {}
        new_type, new_version, new_data = upcasters.upcast_fields(
            event_type, versions[row], stored, transform=data is not None
        )
        types[row], versions[row] = new_type, new_version
        if data is not None and new_data is not stored:
            data[row] = json.dumps(new_data)


def last_position(rows: Sequence[Sequence[Any]]) -> Position | None:
    """Where a bulk page ends (None when it is empty)."""
    return Position(rows[-1][-2], rows[-1][-1]) if rows else None
