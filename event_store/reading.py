"""Reading the log at the speed of the table: streamed pages, events decoded on use, Arrow.

A ``read_all`` page is one ``SELECT … ORDER BY transaction_id, position LIMIT n`` under
the never-skip horizon of :mod:`event_store.store`, run on libpq directly (:func:`read_page`)
in one pipeline with ``enable_sort`` off for that statement: the plan is the index scan on
``(transaction_id, position)`` whatever the statistics (right after a bulk append, before
any ANALYZE, the planner could otherwise sort every row after the position, per page). Rows
stream in chunks (libpq's chunked rows mode), so PostgreSQL produces rows while the client
turns earlier ones into events: on two cores the server and the client work at once.

Rows come in binary and are loaded by psycopg's C loaders, a chunk per call, with the
garbage collector paused (:class:`collector_paused`): the event id as its 16 bytes,
``recorded_at`` as its integer microseconds, ``data`` and ``metadata`` as JSON text kept in
the page (:class:`JsonPage`). Each row becomes a :class:`~event_store.event.RecordedEvent`
directly, keeping id, time, JSON and position encoded until first used; a consumer that
goes through a page's data decodes it a block at a time (one decoder call per block).
Upcasting looks only at events whose type has an upcaster.

For consumers that need a few columns of many events, :func:`arrow_batch` makes one
``pyarrow.RecordBatch`` per page instead: an array per column, no event objects.
"""

import gc
import json
import select
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import capabilities, pq
from psycopg.adapt import AdaptersMap, Transformer
from psycopg.rows import RowMaker
from psycopg.types.numeric import Int8BinaryLoader
from psycopg.types.string import ByteaBinaryLoader

from event_store.event import Position, RecordedEvent, decode_json
from event_store.prepared import Statement, encode
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


class collector_paused:
    """Python's cyclic garbage collector paused for a burst of allocations, then resumed
    (if it was running; left alone if the process had stopped it).

    A page of events is tens of thousands of new objects, none in a cycle. Left running,
    the collector runs every 700 of them and, as they survive, again and again on older
    generations and on every object of the process: measured, that doubled the cost of
    building a page and of decoding its JSON. Paused, it runs once afterwards.
    """

    __slots__ = ("paused",)

    def __enter__(self) -> None:
        self.paused = gc.isenabled()
        if self.paused:
            gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.paused:
            gc.enable()


#: At most this many events' JSON texts are decoded in one decoder call.
JSON_BLOCK = 1024

_UNDECODED: Any = object()


class JsonPage:
    """The ``data`` and ``metadata`` texts of a page of events, decoded on first use.

    A page's events keep only their index into it (``_page``, ``_i``). An event whose
    predecessor's value was used first is taken to be part of a scan of the page: its
    value and those of the next events, up to :data:`JSON_BLOCK`, are decoded together,
    their texts joined into one JSON array for one call of the decoder
    (:func:`~event_store.event.decode_json`: per event, a call costs as long as the decoding),
    with the garbage collector paused. Any other event decodes alone: a consumer that looks at
    the data of a few events pays for those, one that looks at none pays nothing.
    """

    __slots__ = ("_values", "data", "metadata")

    def __init__(self) -> None:
        self.data: list[str] = []
        self.metadata: list[str] = []
        self._values: dict[str, list[Any]] = {}

    def text(self, name: str, index: int) -> str:
        """The JSON text of event ``index``'s ``data`` or ``metadata``."""
        texts: list[str] = getattr(self, name)
        return texts[index]

    def value(self, name: str, index: int) -> Any:
        """Event ``index``'s ``data`` or ``metadata``, decoded (see the class)."""
        texts: list[str] = getattr(self, name)
        values = self._values.get(name)
        if values is None:
            values = self._values[name] = [_UNDECODED] * len(texts)
        value = values[index]
        if value is not _UNDECODED:
            return value
        if index and values[index - 1] is not _UNDECODED:  # a scan: decode ahead
            end = min(index + JSON_BLOCK, len(texts))
            with collector_paused():
                block = decode_json("[" + ",".join(texts[index:end]) + "]")
            values[index:end] = block
            return block[0]
        value = values[index] = decode_json(texts[index])
        return value


def page_rows(page: JsonPage) -> RowMaker[RecordedEvent]:
    """A row maker for a page's rows of :data:`SELECT_EVENT` columns (loaded as
    :func:`raw_loaders` loads them): each an event that decodes its JSON from ``page``."""
    new, setdict = _new, _set
    data, metadata = page.data, page.metadata
    add_data, add_metadata = data.append, metadata.append

    def event(values: Sequence[Any]) -> RecordedEvent:
        (
            event_id,
            stream_id,
            stream_type,
            version,
            event_type,
            schema_version,
            data_text,
            metadata_text,
            recorded_at,
            transaction_id,
            sequence,
        ) = values
        index = len(data)
        add_data(data_text)
        add_metadata(metadata_text)
        made: RecordedEvent = new(RecordedEvent)
        setdict(
            made,
            "__dict__",
            {
                "stream_id": stream_id,
                "stream_type": stream_type,
                "version": version,
                "event_type": event_type,
                "schema_version": schema_version,
                "_recorded_at": recorded_at,
                "_event_id": event_id,
                "_transaction_id": transaction_id,
                "_sequence": sequence,
                "_page": page,
                "_i": index,
            },
        )
        return made

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


# -- read_all pages on libpq --------------------------------------------------------------

#: A ``read_all`` page must come in the order of the ``(transaction_id, position)`` index
#: whatever the planner's statistics say: without them (right after a bulk append, before
#: any ANALYZE) it estimated a bitmap scan of every row after the position plus a sort as
#: cheaper, a whole scan per page. ``enable_sort`` off leaves the index as the only way to
#: that order. Set for the page's statement alone: in the implicit transaction a pipeline
#: runs up to its sync, or, in a caller's transaction, put back right after.
_NO_SORT = b"SELECT set_config('enable_sort', 'off', true)"
_SAVE_AND_NO_SORT = (
    b"SELECT set_config('tributary.enable_sort', current_setting('enable_sort'), true), "
    b"set_config('enable_sort', 'off', true)"
)
_RESTORE_SORT = b"SELECT set_config('enable_sort', current_setting('tributary.enable_sort'), true)"

_STATUS = pq.ExecStatus
_OK = (_STATUS.TUPLES_OK, _STATUS.COMMAND_OK)
_BINARY = pq.Format.BINARY
_IDLE = pq.TransactionStatus.IDLE

#: Loaders of the fast path: psycopg's, but a uuid as its bytes, a timestamptz as its µs.
RAW_ADAPTERS = AdaptersMap(psycopg.adapters)
RAW_ADAPTERS.register_loader("uuid", ByteaBinaryLoader)
RAW_ADAPTERS.register_loader("timestamptz", Int8BinaryLoader)


class _RawContext:
    """What a psycopg ``Transformer`` needs: :data:`RAW_ADAPTERS` and the connection (its
    encoding)."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.adapters = RAW_ADAPTERS
        self.connection = connection


def read_page(
    driver: psycopg.Connection[Any],
    sql: str,
    params: dict[str, Any],
    make_row: RowMaker[Any] | Callable[[Sequence[Any]], Any],
) -> list[Any]:
    """The rows of a ``read_all``-shaped page (:meth:`EventQueries.page`), made by
    ``make_row``, in index order whatever the statistics (see ``_NO_SORT``).

    One round trip: the setting and the statement go in one pipeline, on libpq directly
    (as :mod:`event_store.prepared` does); rows come in chunks of :data:`CHUNK_ROWS`
    (libpq >= 17), each loaded by psycopg's C loaders in one call while PostgreSQL produces
    the next: on two cores the server and the client work at the same time.
    """
    pgconn = driver.pgconn
    if pgconn.pipeline_status:  # inside a psycopg pipeline of the caller's: its way
        with driver.cursor(binary=True) as cursor:
            raw_loaders(cursor)
            cursor.execute(_SAVE_AND_NO_SORT.decode())
            cursor.execute(sql, params)
            fetched = cursor.fetchall()
            cursor.execute(_RESTORE_SORT.decode())
            return [make_row(row) for row in fetched]
    statement = Statement.of(sql)
    args = [encode(params[p]) for p in statement.params]
    saved = False
    if pgconn.transaction_status == _IDLE and not driver.autocommit:
        # psycopg would open the caller's transaction first: let it, with its own BEGIN.
        driver.execute(_SAVE_AND_NO_SORT.decode())
        saved = True
    in_transaction = pgconn.transaction_status != _IDLE
    chunked = capabilities.has_stream_chunked()
    pgconn.enter_pipeline_mode()
    done = False
    try:
        if not saved:
            pgconn.send_query_params(_SAVE_AND_NO_SORT if in_transaction else _NO_SORT, None)
        pgconn.send_query_params(statement.text, args, result_format=_BINARY)
        if in_transaction:
            pgconn.send_query_params(_RESTORE_SORT, None)
        pgconn.pipeline_sync()
        waiter = _Waiter(pgconn)
        failed: pq.abc.PGresult | None = None
        if not saved:
            failed = _statement_result(waiter, failed)
        rows: list[Any] = []
        if failed is None and chunked:
            pgconn.set_chunked_rows_mode(CHUNK_ROWS)
        transformer = Transformer(_RawContext(driver))
        first = True
        while (result := waiter.next()) is not None:
            status = result.status
            if status == _STATUS.TUPLES_CHUNK or (status == _STATUS.TUPLES_OK and first):
                transformer.set_pgresult(result, set_loaders=first)
                first = False
                with collector_paused():
                    rows.extend(transformer.load_rows(0, result.ntuples, make_row))
            elif status not in _OK and failed is None:
                failed = result
        if in_transaction:
            failed = _statement_result(waiter, failed)
        sync = waiter.next()
        assert sync is not None and sync.status == _STATUS.PIPELINE_SYNC, sync
        done = True
    finally:
        if not done:  # interrupted: read what is left up to the sync, if the link allows
            with suppress(Exception):
                _drain(pgconn)
        if pgconn.pipeline_status:
            with suppress(psycopg.Error):
                pgconn.exit_pipeline_mode()
    if failed is not None:
        raise psycopg.errors.error_from_result(failed, encoding=driver.info.encoding)
    return rows


class _Waiter:
    """The next result of a pipeline, waiting on the socket (other threads run)."""

    def __init__(self, pgconn: pq.abc.PGconn) -> None:
        self.pgconn = pgconn
        self.poller = select.poll()
        self.poller.register(pgconn.socket, select.POLLIN | select.POLLOUT)
        while pgconn.flush():  # 1: more to send; read meanwhile so neither side blocks
            if any(event & select.POLLIN for _, event in self.poller.poll()):
                pgconn.consume_input()
        self.poller.modify(pgconn.socket, select.POLLIN)

    def next(self) -> pq.abc.PGresult | None:
        pgconn = self.pgconn
        while pgconn.is_busy():
            self.poller.poll()
            pgconn.consume_input()
        return pgconn.get_result()


def _statement_result(waiter: _Waiter, failed: pq.abc.PGresult | None) -> pq.abc.PGresult | None:
    """Read one statement's results (a short one's); the first failure so far."""
    while (result := waiter.next()) is not None:
        if result.status not in _OK and failed is None:
            failed = result
    return failed


def _drain(pgconn: pq.abc.PGconn) -> None:
    waiter = _Waiter(pgconn)
    while True:
        result = waiter.next()
        if result is not None and result.status == _STATUS.PIPELINE_SYNC:
            return


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
        [_arrow_column(by_name[n], types[n]) for n in kept],
        schema=pa.schema([pa.field(n, types[n], nullable=False) for n in kept]),
    )


#: PostgreSQL's epoch (2000-01-01) in microseconds after the Unix one.
_POSTGRES_EPOCH_US = 946_684_800_000_000


def _arrow_column(values: Sequence[Any], arrow_type: "pa.DataType") -> "pa.Array":
    """An Arrow column; ``recorded_at`` comes as PostgreSQL's microseconds (``raw_loaders``)."""
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    if pa.types.is_timestamp(arrow_type):
        micros = pc.add(pa.array(values, pa.int64()), _POSTGRES_EPOCH_US)
        return micros.cast(arrow_type)
    return pa.array(values, arrow_type)


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
