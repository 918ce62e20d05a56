"""Searches joined with the clicks on their results (the seeds' example): a click joins its
search (same session, same search id) when it happened within one hour after it (corrected
event times); every search ends ``clicked``, or ``no_click`` once its hour has expired, and the
click-through rate is kept per query.

All of it runs in Spark's state store (RocksDB), in two chained stateful operators:

1. ``transformWithStateInPandas`` keyed by the activity topic's Kafka partition (the activity is
   keyed by session, so a search and its clicks share a partition). Per partition the state
   holds the searches still within reach, clicks that came before their search, and the
   partition's *clock*: the largest server receive time seen in it. Each batch, vectorised in
   pandas: new searches are added (``open``), clicks matched (a click joins; its search becomes
   ``clicked``), and every open search whose ``search time + 1 hour + allowed lateness`` the
   clock passed becomes ``no_click`` (no kept click can arrive after that). The clock is the
   data's, not Spark's watermark (which moves one micro-batch late), so a replay in one batch
   expires exactly the searches a live run in many batches expired. It publishes every search
   that changed, every joined click, and per query the changes of its counts.
2. A streaming aggregation per query (update mode) sums those changes: searches, clicked, no
   click, open, and the click-through rate.
"""

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from psycopg import sql

from connectors.stores.pg_tables import TypedColumn
from examples.social.analytics.common import (
    AnalyticsConfig,
    Layout,
    forgotten_held,
    late_counter,
    read_rows,
    stores,
    table,
    typed,
)
from examples.social.analytics.inputs import decoder, inputs
from examples.social.analytics.stateful import (
    FOLDED_FIELDS,
    FORGOTTEN,
    LATE_INPUT,
    late_values,
    to_every_key,
)
from projections.folding import FOLDED_DDL
from projections.time import HOUR_MS, iso_ms, window_key
from projections.view import Query, QueryParam, View
from spark_streaming.deferred_processor import DeferredProcessor
from tributary.view_store import Collection

SEARCHES, CLICKS, QUERIES = "searches", "clicks", "queries"
OPEN, CLICKED, NO_CLICK = "open", "clicked", "no_click"
JOIN_WITHIN_MS = HOUR_MS

SEARCH_COLUMNS = (
    "search_id",
    "session_id",
    "user_id",
    "query",
    "searched_ms",
    "received_ms",
    "status",
    "clicks",
    "first_click_ms",
    "revision",
    "click_ids",
    "hidden",
)
WAITING_COLUMNS = ("click_id", "search_id", "session_id", "post_id", "clicked_ms", "received_ms")
STATE_SCHEMA = "clock long, searches binary, waiting binary"
DELTAS = ("d_searches", "d_clicked", "d_no_click", "d_open")
OUTPUT_DDL = (
    "collection string, key string, position long, deleted boolean, fields string,"
    " member string, changes array<long>, fresh boolean, topic string, partition int,"
    " offset long, error string, raw_key binary, raw_value binary, d_query string,"
    " d_searches long, d_clicked long, d_no_click long, d_open long, ts timestamp"
)


def search_key(search_id: str) -> str:
    return search_id


def query_key(query: str) -> str:
    return window_key(query=query)


# -- one partition's step (pure, column-wise: pandas in, pandas out) ---------------------------


def _empty(columns: tuple[str, ...]) -> Any:
    import pandas as pd  # type: ignore[import-untyped]

    return pd.DataFrame({c: pd.Series(dtype="object") for c in columns})


def _frame_bytes(frame: Any) -> bytes:
    table = pa.Table.from_pandas(frame, preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _frame_of(data: bytes | None, columns: tuple[str, ...]) -> Any:
    if not data:
        return _empty(columns)
    return pa.ipc.open_stream(data).read_all().to_pandas()


def ctr_step(
    partition: int,
    clock: int,
    searches: Any,
    waiting: Any,
    rows: Any,
    allowed_ms: int,
) -> tuple[int, Any, Any, Any, Any]:
    """One batch of one partition: the new clock, searches and waiting clicks, the output rows
    (changed searches, then joined clicks: a frame of the folded columns) and the count changes
    per query. Column-wise throughout: no Python step per record.

    ``rows``: the batch's decoded records of the partition (``kind``, ``kept``, ``event_id``,
    ``session_id``, ``user_id``, ``query``, ``search_id``, ``post_id``, ``corrected_time``,
    ``received_time``). A row of kind ``forgotten`` names a forgotten user: before anything is
    published, the user's searches in the state are *hidden* — their user id dropped, and
    never published again (nor the clicks joining them) — while they still count, anonymously,
    in their query's totals (a click can still join one: the session id stays in the state)."""
    import pandas as pd

    received = rows["received_time"].dropna()
    if len(received):
        clock = max(clock, int(received.max()))
    kept = rows[rows["kept"].fillna(False).astype(bool)]
    state = _search_arrays(searches)
    deltas: list[tuple[Any, tuple[int, int, int, int]]] = []

    # 1. new searches (a search already known is a re-delivery)
    new = kept[kept["kind"] == "search"].drop_duplicates("event_id")
    new = new[~new["event_id"].isin(searches["search_id"])]
    known_before = len(state["search_id"])
    if len(new):
        added = _new_searches(new)
        state = {name: np.concatenate([state[name], added[name]]) for name in state}
        deltas.append((added["query"], (1, 0, 0, 1)))
    touched = np.arange(len(state["search_id"])) >= known_before

    # 2. clicks: this batch's and those waiting for their search
    fresh = kept[kept["kind"] == "click"].drop_duplicates("event_id")
    clicks = pd.DataFrame(
        {
            "click_id": fresh["event_id"].astype(str).to_numpy(),
            "search_id": fresh["search_id"].to_numpy(),
            "session_id": fresh["session_id"].to_numpy(),
            "post_id": fresh["post_id"].to_numpy(),
            "clicked_ms": fresh["corrected_time"].astype("int64").to_numpy(),
            "received_ms": fresh["received_time"].astype("int64").to_numpy(),
        }
    )
    if len(waiting) and len(clicks):
        clicks = pd.concat([waiting, clicks], ignore_index=True).drop_duplicates("click_id")
    elif len(waiting):
        clicks = waiting
    joined = np.zeros(0, dtype="int64")  # positions in ``clicks``
    row = np.zeros(0, dtype="int64")  # each joined click's search
    clicked_ms = np.zeros(0, dtype="int64")
    if len(clicks):
        at = pd.Index(state["search_id"]).get_indexer(clicks["search_id"])
        waiting = clicks[at < 0].reset_index(drop=True)
        candidates = np.flatnonzero(at >= 0)
        row = at[candidates]
        clicked_ms = _ints(clicks["clicked_ms"])[0][candidates]
        delay = clicked_ms - state["searched_ms"][row]
        ok = (
            (clicks["session_id"].to_numpy(dtype=object)[candidates] == state["session_id"][row])
            & (delay >= 0)
            & (delay <= JOIN_WITHIN_MS)
            & ~_listed(
                clicks["click_id"].to_numpy(dtype=object)[candidates], state["click_ids"][row]
            )
        )
        joined, row, clicked_ms = candidates[ok], row[ok], clicked_ms[ok]
        if len(joined):
            hit, opened = _join(
                state, row, clicked_ms, clicks["click_id"].to_numpy(dtype=object)[joined]
            )
            deltas.append((state["query"][hit[opened]], (0, 1, 0, -1)))
            touched[hit] = True
    # 3. expiry by the partition's clock
    expired = (state["status"] == OPEN) & (
        state["searched_ms"] + JOIN_WITHIN_MS + allowed_ms < clock
    )
    if expired.any():
        state["status"][expired] = NO_CLICK
        touched |= expired
        deltas.append((state["query"][expired], (0, 0, 1, -1)))
    # 4. hide the searches of users forgotten, publish what changed (but what is hidden),
    # then forget what no record can reach any more
    _hide(state, _forgotten(rows))
    changed = np.flatnonzero(touched)
    state["revision"][changed] += 1
    shown = ~state["hidden"]
    changed = changed[shown[changed]]
    public = shown[row]
    joined, row, clicked_ms = joined[public], row[public], clicked_ms[public]
    out = _output(partition, state, changed, clicks, joined, row, clicked_ms)
    reach = state["searched_ms"] + JOIN_WITHIN_MS + allowed_ms
    searches = _search_frame(state, reach >= clock)
    if len(waiting):
        waiting = waiting[waiting["clicked_ms"].astype("int64") + allowed_ms >= clock]
        waiting = waiting.reset_index(drop=True)
    return clock, searches, waiting, out, _counts(deltas)


def _forgotten(rows: Any) -> Any:
    """The ids of the users the batch's ``forgotten`` rows name."""
    picked = rows[(rows["kind"] == FORGOTTEN).fillna(False).astype(bool)]
    users, present = _ints(picked["user_id"])
    return np.unique(users[present])


def _hide(state: dict[str, Any], users: Any) -> None:
    """Hide the searches of ``users``: their user id dropped from the state, for good."""
    if len(users):
        hit = state["user_ok"] & np.isin(state["user_id"], users)
        state["hidden"] |= hit
        state["user_ok"][hit] = False
        state["user_id"][hit] = 0


def _ints(column: Any) -> tuple[Any, Any]:
    """A column of integers (int, float or object dtype, with missing values) as a fresh int64
    array (0 where missing) and the mask of the values present."""
    kind = column.dtype.kind if isinstance(column.dtype, np.dtype) else "O"  # Int64: "O"
    if kind in "iu":
        return np.array(column.to_numpy(), dtype="int64"), np.ones(len(column), dtype=bool)
    if kind == "f":
        values = column.to_numpy()
        valid = ~np.isnan(values)
        return np.where(valid, values, 0).astype("int64"), valid
    valid = column.notna().to_numpy()
    return np.array(column.to_numpy(dtype="int64", na_value=0), dtype="int64"), valid


def _search_arrays(frame: Any) -> dict[str, Any]:
    """The stored searches as fresh numpy arrays (the step changes them in place)."""
    user, user_ok = _ints(frame["user_id"])
    first, first_ok = _ints(frame["first_click_ms"])
    return {
        "search_id": frame["search_id"].to_numpy(dtype=object, copy=True),
        "session_id": frame["session_id"].to_numpy(dtype=object, copy=True),
        "user_id": user,
        "user_ok": user_ok,
        "query": frame["query"].to_numpy(dtype=object, copy=True),
        "searched_ms": _ints(frame["searched_ms"])[0],
        "received_ms": _ints(frame["received_ms"])[0],
        "status": frame["status"].to_numpy(dtype=object, copy=True),
        "clicks": _ints(frame["clicks"])[0],
        "first_click_ms": first,
        "first_ok": first_ok,
        "revision": _ints(frame["revision"])[0],
        "click_ids": frame["click_ids"].to_numpy(dtype=object, copy=True),
        # (a state stored before searches could be hidden has no such column)
        "hidden": (
            frame["hidden"].fillna(False).to_numpy(dtype=bool, copy=True)
            if "hidden" in frame
            else np.zeros(len(frame), dtype=bool)
        ),
    }


def _new_searches(new: Any) -> dict[str, Any]:
    count = len(new)
    user, user_ok = _ints(new["user_id"])
    return {
        "search_id": new["event_id"].astype(str).to_numpy(dtype=object),
        "session_id": new["session_id"].to_numpy(dtype=object),
        "user_id": user,
        "user_ok": user_ok,
        "query": new["query"].fillna("").to_numpy(dtype=object),
        "searched_ms": new["corrected_time"].astype("int64").to_numpy(),
        "received_ms": new["received_time"].astype("int64").to_numpy(),
        "status": np.full(count, OPEN, dtype=object),
        "clicks": np.zeros(count, dtype="int64"),
        "first_click_ms": np.zeros(count, dtype="int64"),
        "first_ok": np.zeros(count, dtype=bool),
        "revision": np.zeros(count, dtype="int64"),
        "click_ids": np.full(count, "", dtype=object),
        "hidden": np.zeros(count, dtype=bool),
    }


def _search_frame(state: dict[str, Any], keep: Any) -> Any:
    import pandas as pd

    def ints(name: str, present: str) -> Any:
        return pd.arrays.IntegerArray(state[name][keep], ~state[present][keep])

    columns = {name: state[name][keep] for name in SEARCH_COLUMNS if name in state}
    columns.update(
        user_id=ints("user_id", "user_ok"), first_click_ms=ints("first_click_ms", "first_ok")
    )
    return pd.DataFrame({name: columns[name] for name in SEARCH_COLUMNS})


def _listed(ids: Any, lists: Any) -> Any:
    """Per position: is ``ids[i]`` one of the comma-separated ``lists[i]``?"""
    pieces = pc.split_pattern(pa.array(lists, pa.string()), ",")
    owner = pc.list_parent_indices(pieces)
    same = pc.equal(pc.list_flatten(pieces), pa.array(ids, pa.string()).take(owner))
    out = np.zeros(len(ids), dtype=bool)
    out[owner.to_numpy()[pc.fill_null(same, False).to_numpy(zero_copy_only=False)]] = True
    return out


def _join(state: dict[str, Any], row: Any, clicked_ms: Any, click_ids: Any) -> tuple[Any, Any]:
    """Joined clicks (their search's position, time and id, in arrival order) into their
    searches: ``clicked``, clicks counted, the first click's time, the ids appended in order.
    The searches hit (ascending) and which of them were open."""
    order = np.argsort(row, kind="stable")
    hit, start, count = np.unique(row[order], return_index=True, return_counts=True)
    first = np.minimum.reduceat(clicked_ms[order], start)
    opened = state["status"][hit] == OPEN
    state["status"][hit] = CLICKED
    state["clicks"][hit] += count
    had = state["first_ok"][hit]
    state["first_click_ms"][hit] = np.where(
        had, np.minimum(state["first_click_ms"][hit], first), first
    )
    state["first_ok"][hit] = True
    group = np.repeat(np.arange(len(hit)), count)
    state["click_ids"][hit] = _appended(state["click_ids"][hit], click_ids[order], group)
    return hit, opened


def _appended(lists: Any, ids: Any, owner: Any) -> Any:
    """Per list (comma-separated, empty items dropped): ``ids`` whose ``owner`` is that list
    appended in order, comma-separated again."""
    pieces = pc.split_pattern(pa.array(lists, pa.string()), ",")
    items = pc.list_flatten(pieces)
    present = pc.not_equal(items, "").to_numpy(zero_copy_only=False)
    values = pa.concat_arrays([items.filter(present), pa.array(ids, pa.string())])
    owners = np.concatenate([pc.list_parent_indices(pieces).to_numpy()[present], owner])
    offsets = np.zeros(len(lists) + 1, dtype="int32")
    np.cumsum(np.bincount(owners, minlength=len(lists)), out=offsets[1:])
    order = np.argsort(owners, kind="stable")
    joined = pc.binary_join(pa.ListArray.from_arrays(offsets, values.take(order)), ",")
    return joined.to_numpy(zero_copy_only=False)


def _counts(deltas: list[tuple[Any, tuple[int, int, int, int]]]) -> Any:
    """The count changes per query: one row per change, in the order they happened."""
    import pandas as pd

    parts = [(np.empty(0, dtype=object), (0, 0, 0, 0)), *deltas]
    frame = {"d_query": np.concatenate([queries for queries, _ in parts])}
    for i, name in enumerate(DELTAS):
        frame[name] = np.concatenate(
            [np.full(len(queries), step[i], dtype="int64") for queries, step in parts]
        )
    return pd.DataFrame(frame)


def _output(
    partition: int,
    state: dict[str, Any],
    changed: Any,
    clicks: Any,
    joined: Any,
    row: Any,
    clicked_ms: Any,
) -> Any:
    """The folded rows: every changed search (its next revision), then every joined click."""
    empty = pa.array([], pa.string())
    searches = _search_texts(partition, state, changed) if len(changed) else (empty, empty)
    joins = (
        _click_texts(partition, state, clicks.iloc[joined], row, clicked_ms)
        if len(joined)
        else (empty, empty)
    )
    return _folded(
        np.repeat(np.array([SEARCHES, CLICKS], dtype=object), [len(changed), len(joined)]),
        pa.concat_arrays([searches[0], joins[0]]),
        np.concatenate([state["revision"][changed], np.ones(len(joined), dtype="int64")]),
        pa.concat_arrays([searches[1], joins[1]]),
    )


def _search_texts(partition: int, state: dict[str, Any], changed: Any) -> tuple[Any, Any]:
    """The keys and fields (JSON) of the searches at ``changed``."""
    searched = state["searched_ms"][changed]
    fields = _json_objects(
        len(changed),
        [
            ("search_id", _json_strings(state["search_id"][changed])),
            ("session_id", _json_strings(state["session_id"][changed])),
            ("user_id", _json_ints(state["user_id"][changed], state["user_ok"][changed])),
            ("query", _json_strings(state["query"][changed])),
            ("searched_at", _json_times(searched)),
            ("searched_ms", _json_ints(searched)),
            ("expires_ms", _json_ints(searched + JOIN_WITHIN_MS)),
            ("received_ms", _json_ints(state["received_ms"][changed])),
            ("partition", str(int(partition))),
            ("status", _json_strings(state["status"][changed])),
            ("clicks", _json_ints(state["clicks"][changed])),
            (
                "first_click_ms",
                _json_ints(state["first_click_ms"][changed], state["first_ok"][changed]),
            ),
        ],
    )
    return pa.array(state["search_id"][changed], pa.string()), fields  # search_key: the id


def _click_texts(
    partition: int, state: dict[str, Any], click: Any, row: Any, clicked_ms: Any
) -> tuple[Any, Any]:
    """The keys and fields (JSON) of joined clicks (their search at ``row``)."""
    click_id = _json_strings(click["click_id"].to_numpy(dtype=object))
    post, post_ok = _ints(click["post_id"])
    searched = state["searched_ms"][row]
    fields = _json_objects(
        len(click),
        [
            ("click_id", click_id),
            ("search_id", _json_strings(click["search_id"].to_numpy(dtype=object))),
            ("query", _json_strings(state["query"][row])),
            ("session_id", _json_strings(click["session_id"].to_numpy(dtype=object))),
            ("user_id", _json_ints(state["user_id"][row], state["user_ok"][row])),
            ("post_id", _json_ints(post, post_ok)),
            ("searched_at", _json_times(searched)),
            ("clicked_at", _json_times(clicked_ms)),
            ("delay_ms", _json_ints(clicked_ms - searched)),
            ("received_ms", _json_ints(_ints(click["received_ms"])[0])),
            ("partition", str(int(partition))),
        ],
    )
    return _json_objects(len(click), [("click_id", click_id)]), fields  # window_key(click_id=)


def _folded(collection: Any, key: Any, position: Any, fields: Any) -> Any:
    """Folded Put rows (the columns of ``FOLDED_FIELDS``) from columns."""
    import pandas as pd

    size = len(position)
    columns: dict[str, Any] = {name: np.full(size, None, dtype=object) for name in FOLDED_FIELDS}
    columns.update(
        collection=collection,
        key=key.to_numpy(zero_copy_only=False),
        position=np.asarray(position, dtype="int64"),
        deleted=np.zeros(size, dtype=bool),
        fields=fields.to_numpy(zero_copy_only=False),
        fresh=np.zeros(size, dtype=bool),
    )
    return pd.DataFrame(columns)


# -- JSON text, column-wise: the text json.dumps(..., separators=(",", ":")) writes ----------

_NEEDS_ESCAPE = r'[\x00-\x1f"\\\x7f]'  # what json.dumps escapes, besides non-ASCII
_ISO_FROM_MS = -30_610_224_000_000  # 1000-01-01: iso_ms writes four-digit years from here
_ISO_TO_MS = 253_402_300_800_000  # 10000-01-01


def _json_strings(values: Any) -> Any:
    """Strings (``None`` as ``null``) as JSON string literals: plain ASCII quoted column-wise,
    the few that need escaping through ``json.dumps`` itself (the same text either way)."""
    text = pa.array(values, pa.string(), from_pandas=True)
    quoted = pc.binary_join_element_wise('"', text, '"', "")
    escape = pc.or_(
        pc.match_substring_regex(text, _NEEDS_ESCAPE), pc.invert(pc.string_is_ascii(text))
    )
    escape = pc.fill_null(escape, False)
    if pc.any(escape).as_py():
        escaped = [json.dumps(value) for value in text.filter(escape).to_pylist()]
        quoted = pc.replace_with_mask(quoted, escape, pa.array(escaped, pa.string()))
    return pc.fill_null(quoted, "null")


def _json_ints(values: Any, present: Any = None) -> Any:
    """int64 values (missing where ``present`` is False) as JSON numbers or ``null``."""
    numbers = pa.array(values, pa.int64(), mask=None if present is None else ~present)
    return pc.fill_null(pc.cast(numbers, pa.string()), "null")


def _json_times(ms: Any) -> Any:
    """Epoch milliseconds as JSON strings of their :func:`projections.time.iso_ms` text."""
    ms = np.asarray(ms, dtype="int64")
    inside = (ms >= _ISO_FROM_MS) & (ms < _ISO_TO_MS)
    moments = pa.array(np.where(inside, ms, 0), pa.int64()).cast(pa.timestamp("ms"))
    text = pc.cast(moments, pa.string())  # 2026-01-01 12:00:00.000: four-digit years here
    text = pc.binary_replace_slice(text, 10, 11, "T")
    text = pc.binary_join_element_wise('"', text, 'Z"', "")
    if not inside.all():
        others = [json.dumps(iso_ms(int(m))) for m in ms[~inside]]
        text = pc.replace_with_mask(text, pa.array(~inside), pa.array(others, pa.string()))
    return text


def _json_objects(size: int, fields: list[tuple[str, Any]]) -> Any:
    """Compact JSON objects, keys in this order, from each field's JSON text (an array, or one
    text for every row)."""
    if size == 0:
        return pa.array([], pa.string())
    parts: list[Any] = []
    for i, (name, text) in enumerate(fields):
        parts += [("{" if i == 0 else ",") + json.dumps(name) + ":", text]
    return pc.binary_join_element_wise(*parts, "}", "")


def _typed(frame: Any) -> Any:
    """Folded rows or count changes as the processor's output columns, typed as Spark reads
    them (every frame the same columns in the same order and types, so that they concatenate
    as they are: pandas looks at every value of a column it has to align)."""
    for name in ("d_query", *DELTAS, *FOLDED_FIELDS):
        if name not in frame:
            frame[name] = None
    for name in ("position", "partition", "offset", *DELTAS):
        frame[name] = frame[name].astype("Int64")
    for name in ("deleted", "fresh"):
        frame[name] = frame[name].astype("boolean")
    for name in (
        "collection",
        "key",
        "fields",
        "member",
        "changes",
        "topic",
        "error",
        "raw_key",
        "raw_value",
        "d_query",
    ):
        column = frame[name].astype(object)
        frame[name] = column.where(column.notna(), None)
    return frame[[*FOLDED_FIELDS, "d_query", *DELTAS]]  # in one order: a plain concatenation


def _stacked(frames: list[Any]) -> Any:
    """Frames of the same columns one after the other, column by column: a frame concatenation
    may align their blocks value by value (seconds per 100k rows of all-null object columns)."""
    import pandas as pd

    if len(frames) == 1:
        return frames[0]
    return pd.DataFrame(
        {name: pd.concat([f[name] for f in frames], ignore_index=True) for name in frames[0]}
    )


def _processor(allowed_ms: int, job: str) -> Any:
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class CtrProcessor(StatefulProcessor):
        """One Kafka partition of the activity: its clock, searches and waiting clicks in one
        value of Spark's state store (Arrow IPC inside), read and written once per batch. A
        forgotten user's row (a copy reaches every partition) hides the user's searches."""

        def init(self, handle: Any) -> None:
            self.handle = handle
            self.state = handle.getValueState("ctr", STATE_SCHEMA)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            partition = int(key[0])
            frame = _stacked(list(rows))
            # a forget reaches every partition; it passes through (as the job's ``forgotten``
            # entry) from one of them, the others' copies (``echo``) only hide
            late = late_values(frame[~frame["echo"].fillna(False).astype(bool)], job)
            frame = frame[frame["error"].isna()]
            stored = self.state.get() if self.state.exists() else None
            if stored is None and (frame["kind"] == FORGOTTEN).fillna(False).astype(bool).all():
                # a partition with nothing in it (yet): no state to hide anything from
                if late:
                    result = _typed(pd.DataFrame(late, columns=list(FOLDED_FIELDS)))
                    result["ts"] = pd.Timestamp(
                        int(timerValues.getCurrentWatermarkInMs()), unit="ms"
                    )
                    yield result[[*FOLDED_FIELDS, "d_query", *DELTAS, "ts"]]
                return
            clock = int(stored[0]) if stored else 0
            searches = _frame_of(stored[1] if stored else None, SEARCH_COLUMNS)
            waiting = _frame_of(stored[2] if stored else None, WAITING_COLUMNS)
            clock, searches, waiting, out, counts = ctr_step(
                partition, clock, searches, waiting, frame, allowed_ms
            )
            self.state.update((clock, _frame_bytes(searches), _frame_bytes(waiting)))
            # The chained aggregation drops rows older than the watermark: stamp them with
            # the later of the watermark and the partition's clock.
            stamp = pd.Timestamp(max(clock, int(timerValues.getCurrentWatermarkInMs())), unit="ms")
            parts = (out, pd.DataFrame(late, columns=list(FOLDED_FIELDS)), counts)
            frames = [_typed(part) for part in parts if len(part)]
            if frames:
                result = _stacked(frames)
                result["ts"] = stamp
                yield result[[*FOLDED_FIELDS, "d_query", *DELTAS, "ts"]]

        def close(self) -> None:
            pass

    return CtrProcessor()


TOTALS_BUCKETS = 8
TOTALS_STATE = "totals binary"
TOTALS_COLUMNS = ("query", "searches", "clicked", "no_click", "open", "revision")


def totals_step(stored: Any, deltas: Any) -> tuple[Any, Any]:
    """Count changes per query added to the stored totals (pandas): the new totals, and the
    queries whose totals changed (with their next revision)."""
    import pandas as pd

    sums = (
        deltas.groupby("d_query", sort=True)[list(DELTAS)]
        .sum()
        .rename(columns=lambda c: c.removeprefix("d_"))
        .reset_index()
        .rename(columns={"d_query": "query"})
    )
    merged = sums.merge(stored, on="query", how="left", suffixes=("", "_was")).fillna(0)
    for name in ("searches", "clicked", "no_click", "open"):
        merged[name] = merged[name].astype("int64") + merged[f"{name}_was"].astype("int64")
    merged["revision"] = merged["revision"].astype("int64") + 1
    changed = merged[list(TOTALS_COLUMNS)]
    others = stored[~stored["query"].isin(changed["query"])]
    totals = pd.concat([others, changed], ignore_index=True) if len(others) else changed
    return totals, changed.reset_index(drop=True)


def query_rows(changed: Any) -> Any:
    """The folded rows of the queries whose totals changed (``totals_step``'s second frame):
    their counts and click-through rate (``clicked / searches``, six decimals; ``null`` while
    there are no searches), built column-wise."""
    searches = changed["searches"].to_numpy(dtype="int64")
    clicked = changed[CLICKED].to_numpy(dtype="int64")
    query = _json_strings(changed["query"].to_numpy(dtype=object))
    fields = _json_objects(
        len(changed),
        [
            ("query", query),
            ("searches", _json_ints(searches)),
            (CLICKED, _json_ints(clicked)),
            (NO_CLICK, _json_ints(changed[NO_CLICK].to_numpy(dtype="int64"))),
            (OPEN, _json_ints(changed[OPEN].to_numpy(dtype="int64"))),
            ("ctr", _json_ctr(clicked, searches)),
        ],
    )
    return _folded(
        np.full(len(changed), QUERIES, dtype=object),
        _json_objects(len(changed), [("query", query)]),  # query_key
        changed["revision"].to_numpy(dtype="int64"),
        fields,
    )


_SMALL_CTR = pa.array([repr(k / 1_000_000) for k in range(100)])  # below 1e-4: 1e-06, 1.2e-05


def _json_ctr(clicked: Any, searches: Any) -> Any:
    """``round(clicked / searches, 6)`` as the JSON text ``json.dumps`` writes (``null`` for no
    searches). The six decimals are rounded in integers, exactly as Python's ``round`` rounds
    the quotient, unless the quotient lies exactly half-way (or the counts are beyond 4e9): those
    rare rows go through Python's ``round`` itself."""
    c = np.asarray(clicked, dtype="int64")
    s = np.asarray(searches, dtype="int64")
    exact = (s > 0) & (c >= 0) & (c <= s) & (s < 4_000_000_000)
    den = np.where(exact, s, 1)
    k, rem = np.divmod(np.where(exact, c, 0) * 1_000_000, den)
    k += 2 * rem > den
    exact &= 2 * rem != den
    digits = pc.utf8_rtrim(pc.utf8_lpad(pc.cast(pa.array(k), pa.string()), 6, "0"), "0")
    text = pc.binary_join_element_wise("0.", digits, "")  # 0.0001 .. 0.999999: Python's repr
    text = pc.if_else(pa.array(k == 0), "0.0", text)
    text = pc.if_else(pa.array(k == 1_000_000), "1.0", text)
    small = (k > 0) & (k < 100)
    text = pc.if_else(pa.array(small), _SMALL_CTR.take(np.where(small, k, 0)), text)
    text = pc.if_else(pa.array(s == 0), "null", text)
    other = ~exact & (s != 0)
    if other.any():
        rounded = [
            json.dumps(round(int(a) / int(b), 6)) for a, b in zip(c[other], s[other], strict=True)
        ]
        text = pc.replace_with_mask(text, pa.array(other), pa.array(rounded, pa.string()))
    return text


def _totals_processor() -> Any:
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class TotalsProcessor(StatefulProcessor):
        """A bucket of queries: their totals (Arrow IPC in one state value). The partition
        processor's other rows pass through: one chain, each record read once."""

        def init(self, handle: Any) -> None:
            self.state = handle.getValueState("totals", TOTALS_STATE)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            frame = _stacked(list(rows))
            counting = frame["d_query"].notna()
            out = frame[~counting][list(FOLDED_FIELDS)]
            if counting.any():
                stored = self.state.get() if self.state.exists() else None
                totals = (
                    pa.ipc.open_stream(stored[0]).read_all().to_pandas()
                    if stored
                    else pd.DataFrame({c: pd.Series(dtype="int64") for c in TOTALS_COLUMNS})
                )
                totals, changed = totals_step(totals, frame[counting])
                self.state.update((_frame_bytes(totals),))
                queries = query_rows(changed)
                out = _stacked([out, queries]) if len(out) else queries
            if len(out):
                for name in ("position", "partition", "offset"):
                    out[name] = out[name].astype("Int64")
                for name in ("deleted", "fresh"):
                    out[name] = out[name].astype("boolean")
                yield out

        def close(self) -> None:
            pass

    return TotalsProcessor()


def ctr_fold(config: AnalyticsConfig, job: str) -> Any:
    allowed_ms = config.lateness.allowed_ms

    def fold(records: Any) -> Any:
        from pyspark.sql import functions as F

        # A forget must reach the state of every partition of the activity topic (each holds
        # searches of any user): one copy of its row per partition there is now.
        partitions = activity_partitions(config)
        ev = inputs(records, config.lateness)
        # One chain (a second branch off the source would read the topic again): every
        # activity record to the partition's processor, its rows to the totals per query.
        # A forgotten user's row passes through as its ``forgotten`` entry (never ``kept``).
        forget = F.col("kind") == FORGOTTEN
        activity = ev.where(
            F.col("error").isNotNull() | F.col("kind").isin("search", "click", FORGOTTEN)
        ).withColumn("p", to_every_key(forget, partitions, F.col("partition")))
        steps = (
            activity.select(
                "p",
                (forget & (F.col("p") > 0)).alias("echo"),
                (F.col("kind").isin("search", "click") & ~F.col("beyond")).alias("kept"),
                "session_id",
                "user_id",
                "query",
                "search_id",
                "post_id",
                *LATE_INPUT,
            )
            .groupBy("p")
            .transformWithStateInPandas(
                DeferredProcessor.of(_processor, allowed_ms, config.name(job)),
                OUTPUT_DDL,
                "Append",
                "EventTime",
                eventTimeColumnName="ts",
            )
        )
        bucket = F.pmod(
            F.xxhash64(F.coalesce(F.col("d_query"), F.col("key"), F.lit(""))), F.lit(TOTALS_BUCKETS)
        )
        return (
            steps.withColumn("bucket", bucket)
            .groupBy("bucket")
            .transformWithStateInPandas(
                DeferredProcessor.of(_totals_processor), FOLDED_DDL, "Append", "None"
            )
        )

    return fold


def activity_partitions(config: AnalyticsConfig) -> int:
    """The partitions of the activity topic now (1 when it does not exist yet)."""
    from connectors.kafka import TopicAdmin  # the driver's: the fold is planned there

    return max(1, TopicAdmin(config.kafka).partition_count(config.activity_topic) or 1)


#: The outputs naming a user (purged when the user is forgotten).
HOLDERS = {SEARCHES: ("user_id",), CLICKS: ("user_id",)}


def ctr_view(config: AnalyticsConfig) -> View:
    job = "ctr"
    layouts: list[Layout] = [
        Collection(SEARCHES),
        typed(
            CLICKS,
            "analytics_search_clicks",
            ("click_id",),
            TypedColumn("click_id", "text"),
            TypedColumn("search_id", "text"),
            TypedColumn("query", "text"),
            TypedColumn("session_id", "text"),
            TypedColumn("user_id", "bigint"),
            TypedColumn("post_id", "bigint"),
            TypedColumn("searched_at", "timestamptz"),
            TypedColumn("clicked_at", "timestamptz"),
            TypedColumn("delay_ms", "bigint"),
            TypedColumn("received_ms", "bigint"),
            TypedColumn("partition", "integer"),
        ),
        typed(
            QUERIES,
            "analytics_ctr",
            ("query",),
            TypedColumn("query", "text"),
            TypedColumn("searches", "bigint"),
            TypedColumn(CLICKED, "bigint"),
            TypedColumn(NO_CLICK, "bigint"),
            TypedColumn(OPEN, "bigint"),
            TypedColumn("ctr", "double precision"),
        ),
    ]
    store, also = stores(config, job, layouts, QUERIES, holders=HOLDERS)

    def ctr(query: str = "", limit: int = 50) -> Any:
        columns = sql.SQL("query, searches, clicked, no_click, open, ctr")
        if query:
            rows = read_rows(
                config,
                sql.SQL("SELECT {} FROM {} WHERE query = %s").format(
                    columns, table(config, "analytics_ctr")
                ),
                (query,),
            )
            if not rows:
                raise LookupError(f"no searches for {query!r}")
            return rows[0]
        return read_rows(
            config,
            sql.SQL("SELECT {} FROM {} ORDER BY searches DESC, query LIMIT %s").format(
                columns, table(config, "analytics_ctr")
            ),
            (limit,),
        )

    return View(
        name=config.name(job),
        decode=decoder(config.kinds(), config.registry_url),
        topics=(config.activity_topic, config.subjects_topic),
        fold=ctr_fold(config, job),
        store=store,
        also=also,
        stateful=True,
        metrics=late_counter(config, store),
        verify=lambda: forgotten_held(config, store, HOLDERS),
        description="searches joined with their clicks within an hour: click-through rate per"
        " query, searches with no click once their hour expired",
        queries=(
            Query(
                "ctr",
                "/analytics/ctr",
                (
                    QueryParam(
                        "query",
                        str,
                        default="",
                        maximum=200,
                        description="one query's CTR",
                        positional=True,
                    ),
                    QueryParam("limit", int, default=50, minimum=1, maximum=1000),
                ),
                ctr,
                "Click-through rate per search query (searches, clicked, no click, open).",
            ),
        ),
    )
