"""The fast reads against what they replace, and against concurrent writers.

``read_all`` streams its page and builds events from C-loaded columns; these tests hold it
to the plain SQLAlchemy query it replaced (same events, same order, every field), check the
Arrow reader against it, and run the streamed path (pages larger than a chunk) while
writers commit out of position order.
"""

import json
import random
import threading
import time
from collections import defaultdict
from typing import Any

import pytest
from sqlalchemy import BigInteger, Text, cast, func, select, text, tuple_

from event_store import ConcurrencyError, EventStore, NewEvent, Position, RecordedEvent, Upcasters
from event_store.reading import CHUNK_ROWS
from tests.integration.event_store.conftest import StoreEnv

TRICKY = {"text": 'quote " backslash \\ tab \t é 💥', "n": 2**70, "f": 1.5, "list": [None, True]}


def _old_read_all(env: StoreEnv, after: Position | None, limit: int) -> list[RecordedEvent]:
    """``read_all`` as it was before the streamed reader: SQLAlchemy rows, field by field."""
    t = env.store.tables.events
    horizon = cast(cast(func.pg_snapshot_xmin(func.pg_current_snapshot()), Text), BigInteger)
    query = select(t).where(t.c.transaction_id < horizon)
    if after is not None:
        query = query.where(
            tuple_(t.c.transaction_id, t.c.position) > tuple_(after.transaction_id, after.sequence)
        )
    with env.app.connect() as conn:
        rows = conn.execute(query.order_by(t.c.transaction_id, t.c.position).limit(limit)).all()
    return [
        RecordedEvent.from_columns([r._mapping[c] for c in RecordedEvent.COLUMNS]) for r in rows
    ]


def _fill(env: StoreEnv, streams: int = 6, per_stream: int = 900) -> None:
    for s in range(streams):
        for part in range(per_stream // 300):
            batch = [
                NewEvent("Tick", {"s": s, "k": k, **TRICKY}, metadata={"m": k}) for k in range(300)
            ]
            env.store.append(f"s-{s}", batch, part * 300, stream_type="tick")
        env.store.append(f"one-{s}", [NewEvent("One", TRICKY)], 0, stream_type="one")


def test_streamed_read_all_equals_the_old_one_on_the_same_data(env: StoreEnv) -> None:
    _fill(env)
    total = env.count_events()
    assert total > 2 * CHUNK_ROWS  # pages below stream in several chunks
    old = _old_read_all(env, None, total + 10)
    for limit in (1, 7, CHUNK_ROWS + 1, total + 10):
        new: list[RecordedEvent] = []
        after = None
        while page := env.store.read_all(after, limit=limit):
            new.extend(page)
            after = page[-1].position
        assert new == old, f"limit {limit}"
    assert list(env.store.iter_all(page_size=CHUNK_ROWS * 2)) == old
    assert list(env.store.iter_all(old[100].position, page_size=999)) == old[101:]
    assert env.store.read_stream("s-2", from_version=5, to_version=7) == [
        e for e in old if e.stream_id == "s-2" and 5 <= e.version <= 7
    ]
    one = next(e for e in old if e.stream_id == "one-0")
    assert one.data == TRICKY and one.recorded_at == env.store.read_stream("one-0")[0].recorded_at


def test_arrow_batches_hold_the_same_rows_in_the_same_order(env: StoreEnv) -> None:
    _fill(env, streams=3)
    events = list(env.store.iter_all())
    columns = ("event_id", "stream_id", "version", "event_type", "data", "recorded_at")
    batches = list(env.store.read_batches(columns, batch_size=CHUNK_ROWS + 500))
    assert [b.num_rows for b in batches[:-1]] == [CHUNK_ROWS + 500] * (len(batches) - 1)
    table: dict[str, list[Any]] = defaultdict(list)
    for batch in batches:
        assert batch.schema.names == [*columns, "transaction_id", "position"]
        for name, values in batch.to_pydict().items():
            table[name].extend(values)
    assert table["event_id"] == [str(e.event_id) for e in events]
    assert table["stream_id"] == [e.stream_id for e in events]
    assert table["version"] == [e.version for e in events]
    assert [json.loads(d) for d in table["data"]] == [e.data for e in events]
    assert table["recorded_at"] == [e.recorded_at for e in events]
    positions = [
        Position(t, p) for t, p in zip(table["transaction_id"], table["position"], strict=True)
    ]
    assert positions == [e.position for e in events]
    middle = events[len(events) // 2].position
    rest = list(env.store.read_batches(("stream_id",), after=middle))
    assert sum(b.num_rows for b in rest) == len(events) // 2 - 1 + len(events) % 2
    assert list(env.store.read_batches(("stream_id",), after=events[-1].position)) == []
    with pytest.raises(ValueError, match="unknown columns"):
        list(env.store.read_batches(("payload",)))


def test_bulk_reads_upcast_only_the_types_that_have_an_upcaster(env: StoreEnv) -> None:
    upcasters = Upcasters()
    upcasters.register("Old", 1, "New", 2, lambda d: {**d, "n": d["n"] * 10})
    env.store.append(
        "u-1", [NewEvent("Old", {"n": 1}), NewEvent("Kept", {"n": 2})], 0, stream_type="u"
    )
    store = EventStore(env.app, env.schema, upcasters)
    [batch] = store.read_batches(("data",))
    assert batch.schema.names == ["data", "transaction_id", "position"]
    assert [json.loads(d) for d in batch.column("data").to_pylist()] == [{"n": 10}, {"n": 2}]
    [typed] = store.read_batches(("event_type", "schema_version"))
    assert typed.column("event_type").to_pylist() == ["New", "Kept"]
    assert typed.column("schema_version").to_pylist() == [2, 1]
    events = store.read_all()
    assert [(e.event_type, e.schema_version, e.data) for e in events] == [
        ("New", 2, {"n": 10}),
        ("Kept", 1, {"n": 2}),
    ]


WRITERS = 3


def _writer(env: StoreEnv, seed: int, stop: threading.Event, errors: list[BaseException]) -> None:
    rng = random.Random(seed)
    try:
        while not stop.is_set():
            stream = f"w-{rng.randrange(8)}"
            batch = [NewEvent("Tick", {"w": seed}) for _ in range(rng.randint(1, 40))]
            try:
                env.store.append(stream, batch, env.store.stream_version(stream), stream_type="t")
            except ConcurrencyError:
                continue
    except BaseException as exc:
        errors.append(exc)


def _late_committer(env: StoreEnv, stop: threading.Event, errors: list[BaseException]) -> None:
    """Takes positions early, commits late: the hazard that the horizon guards against."""
    try:
        i = 0
        while not stop.is_set():
            with env.app.begin() as conn:
                batch = [NewEvent("Late", {"i": i}) for _ in range(50)]
                env.store.append(f"late-{i}", batch, 0, stream_type="t", connection=conn)
                time.sleep(0.15)
            i += 1
    except BaseException as exc:
        errors.append(exc)


def test_streamed_pages_never_skip_and_keep_order_under_concurrent_writers(env: StoreEnv) -> None:
    stop, errors = threading.Event(), []
    threads = [
        threading.Thread(target=_writer, args=(env, i, stop, errors)) for i in range(WRITERS)
    ]
    threads.append(threading.Thread(target=_late_committer, args=(env, stop, errors)))
    for t in threads:
        t.start()
    seen: list[RecordedEvent] = []
    batched: list[tuple[int, int, str]] = []
    after: Position | None = None
    batch_after: Position | None = None
    # Read while they write: at least 4 s, and until the pages have streamed in several chunks
    # (a busy machine writes slower; CI once wrote 7,151 events in 4 s).
    started = time.monotonic()
    while time.monotonic() < started + 4 or (
        len(seen) <= 4 * CHUNK_ROWS and time.monotonic() < started + 90
    ):
        page = list(env.store.iter_all(after, page_size=CHUNK_ROWS + 1))
        seen.extend(page)
        after = page[-1].position if page else after
        for b in env.store.read_batches(
            ("event_id",), after=batch_after, batch_size=CHUNK_ROWS + 1
        ):
            rows = b.to_pydict()
            batched.extend(
                zip(rows["transaction_id"], rows["position"], rows["event_id"], strict=True)
            )
            batch_after = Position(rows["transaction_id"][-1], rows["position"][-1])
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors
    total = env.count_events()
    deadline = time.monotonic() + 60  # other sessions' open transactions may hold the horizon
    while len(seen) < total and time.monotonic() < deadline:
        page = env.store.read_all(after, limit=CHUNK_ROWS + 1)
        seen.extend(page)
        after = page[-1].position if page else after
        if not page:
            time.sleep(0.05)
    while len(batched) < total and time.monotonic() < deadline:
        got = 0
        for b in env.store.read_batches(("event_id",), after=batch_after):
            rows = b.to_pydict()
            batched.extend(
                zip(rows["transaction_id"], rows["position"], rows["event_id"], strict=True)
            )
            batch_after = Position(rows["transaction_id"][-1], rows["position"][-1])
            got += b.num_rows
        if not got:
            time.sleep(0.05)

    with env.admin.connect() as conn:
        stored = {
            str(r[0]) for r in conn.execute(text(f"SELECT event_id FROM {env.schema}.events"))
        }
    ids = [str(e.event_id) for e in seen]
    assert len(ids) == len(set(ids)) and set(ids) == stored
    assert [e.position for e in seen] == sorted(e.position for e in seen)
    assert [b[2] for b in batched] == ids  # the bulk reader: the same events, the same order
    versions: dict[str, list[int]] = defaultdict(list)
    for event in seen:
        versions[event.stream_id].append(event.version)
    assert all(vs == list(range(1, len(vs) + 1)) for vs in versions.values())
    late = [e for e in seen if e.event_type == "Late"]
    assert late, "the late committer never committed: the test proved nothing"
    assert len(stored) > 4 * CHUNK_ROWS  # pages really streamed in chunks
