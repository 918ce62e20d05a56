"""The store contract: every view store (PostgreSQL, Redis, tantivy, Kafka) passes these tests.

- a batch whose offsets the store already reached is skipped whole;
- a write at or below the key's stored position changes nothing (applied counts included),
  and an old insert cannot bring back a deleted key;
- a batch that starts past what the store reached is refused;
- a crash between the data and the ledger is impossible: killed (SIGKILL) just before the
  commit, the store shows neither; the batch then applies exactly once;
- the materializer runs in the same atomic unit and sees the unit's own writes; ``count``
  of a lookup is what ``find`` returns, counted;
- a swap is atomic for readers; discarding a shadow leaves the live generation alone; a live
  writer of a replaced generation stops;
- a batch given as the Arrow write table applies exactly as its Put/Delete objects do;
- a new writer (a restarted job) guards from what the store holds;
- two generations compare by key and digest (``digests``, ``compare_generations``): equal ones
  built in different batches compare equal; a changed, a missing and an extra entry are each
  listed with their key and both entries.
"""

import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from connectors.errors import LedgerGapError, StaleGenerationError
from connectors.stores.compare import compare_generations
from tests.integration.conftest import Endpoints
from tests.integration.stores.backends import KINDS, StoreSpec, build
from tributary.view_model import (
    Applied,
    Batch,
    Delete,
    Entry,
    JsonObject,
    Put,
    Rejected,
    write_table,
)
from tributary.view_store import CommitHooks, StoreTxn, ViewStore

ROOT = Path(__file__).resolve().parents[3]
TOPIC = "contract.source"


def offsets(end: int, partition: int = 0) -> dict[str, dict[str, int]]:
    return {TOPIC: {str(partition): end}}


def item(key: str, position: int, group: str, value: int, **kw: Any) -> Put:
    return Put("items", key, position, {"group": group, "v": value}, **kw)


def state(
    store: ViewStore, collection: str = "items", generation: str | None = None
) -> dict[str, Any]:
    return {e.key: e.fields for e in store.scan(collection, generation)}


def counts(store: ViewStore) -> dict[str, int]:
    return {e.key: e.applied for e in store.scan("items")}


@pytest.fixture(params=KINDS)
def spec(request: pytest.FixtureRequest, stack: Endpoints, tmp_path: Path) -> StoreSpec:
    return StoreSpec(
        kind=request.param,
        view=f"contract-{uuid.uuid4().hex[:8]}",
        postgres_dsn=stack.postgres_dsn,
        redis_url=stack.redis_url,
        bootstrap_servers=stack.bootstrap_servers,
        kafka_extra=dict(stack.kafka.extra),
        root=str(tmp_path / "stores"),
    )


@pytest.fixture
def store(spec: StoreSpec) -> Iterator[ViewStore]:
    out = build(spec)
    yield out
    for generation in out.generations():
        if generation != out.live_generation():
            out.discard(generation)
    out.close()


def test_a_batch_is_applied_with_its_ledger(store: ViewStore) -> None:
    gen = store.live_generation()
    writer = store.writer(gen, live=True)
    assert writer.committed().batch_id == -1
    batch = Batch(0, offsets(2), [item("a", 10, "x", 1), item("b", 11, "x", 2)])
    assert writer.apply(batch)
    assert state(store) == {"a": {"group": "x", "v": 1}, "b": {"group": "x", "v": 2}}
    commit = store.committed(gen)
    assert (commit.batch_id, commit.offsets, commit.batches) == (0, offsets(2), 1)
    assert store.get("items", "a") == Entry("items", "a", {"group": "x", "v": 1}, 10, 1)
    assert store.get("items", "zz") is None
    writer.close()
    # A new store object (a restarted job) reads the same ledger.
    assert store.writer(gen, live=True).committed().offsets == offsets(2)


def test_a_batch_whose_offsets_are_reached_is_skipped_whole(store: ViewStore) -> None:
    writer = store.writer(store.live_generation(), live=True)
    assert writer.apply(Batch(0, offsets(1), [item("a", 10, "x", 1)]))
    assert writer.apply(Batch(1, offsets(2), [item("a", 11, "x", 2, changes=(11,))]))
    # Spark re-runs the batch after a crash (or an old checkpoint replays it): nothing changes.
    assert not writer.apply(Batch(1, offsets(2), [item("a", 11, "x", 2, changes=(11,))]))
    assert not writer.apply(Batch(7, offsets(2), [item("a", 99, "y", 9)]))
    assert state(store) == {"a": {"group": "x", "v": 2}}
    assert counts(store) == {"a": 2}
    assert store.committed(store.live_generation()).batches == 2


def test_writes_at_or_below_the_stored_position_change_nothing(store: ViewStore) -> None:
    writer = store.writer(store.live_generation(), live=True)
    writer.apply(Batch(0, offsets(2), [item("a", 10, "x", 1, fresh=True), item("b", 12, "x", 1)]))
    writer.apply(Batch(1, offsets(4), [item("a", 20, "x", 2), Delete("items", "b", 30)]))
    # Re-sent old records in later batches: an old update, an old insert of the deleted key.
    writer.apply(
        Batch(
            2, offsets(6), [item("a", 15, "y", 7, changes=(15,)), item("b", 12, "x", 1, fresh=True)]
        )
    )
    assert state(store) == {"a": {"group": "x", "v": 2}}
    assert counts(store) == {"a": 2}
    # A newer insert of the deleted key brings it back, counted from one.
    writer.apply(Batch(3, offsets(7), [item("b", 40, "z", 5, fresh=True)]))
    assert state(store)["b"] == {"group": "z", "v": 5}
    assert counts(store)["b"] == 1


def test_applied_counts_count_only_changes_above_the_stored_position(store: ViewStore) -> None:
    writer = store.writer(store.live_generation(), live=True)
    writer.apply(Batch(0, offsets(2), [item("a", 12, "x", 1, changes=(10, 12), fresh=True)]))
    assert counts(store) == {"a": 2}
    # Redelivered changes 10 and 12 folded with a new 14: only 14 counts.
    writer.apply(Batch(1, offsets(5), [item("a", 14, "x", 3, changes=(10, 12, 14), fresh=True)]))
    assert counts(store) == {"a": 3}
    # Deleted and created again in one batch: the count restarts.
    writer.apply(Batch(2, offsets(8), [item("a", 30, "x", 4, changes=(25, 30), fresh=True)]))
    assert counts(store) == {"a": 2}


def test_a_batch_that_leaves_a_gap_is_refused(store: ViewStore) -> None:
    writer = store.writer(store.live_generation(), live=True)
    writer.apply(Batch(0, offsets(5), [item("a", 10, "x", 1)]))
    with pytest.raises(LedgerGapError, match=r"contract.source\[0\]"):
        writer.apply(Batch(1, offsets(9), [item("b", 20, "x", 1)], start=offsets(7)))
    assert state(store) == {"a": {"group": "x", "v": 1}}
    # A batch that starts below what the store reached is fine (its old records were filtered).
    assert writer.apply(Batch(2, offsets(9), [item("b", 20, "x", 1)], start=offsets(3)))
    assert store.committed(store.live_generation()).offsets == offsets(9)


def test_the_materializer_runs_in_the_unit_and_sees_its_writes(store: ViewStore) -> None:
    writer = store.writer(store.live_generation(), live=True)
    writer.apply(
        Batch(0, offsets(3), [item("a", 1, "x", 1), item("b", 2, "x", 1), item("c", 3, "y", 1)])
    )
    assert state(store, "groups") == {"x": {"count": 2}, "y": {"count": 1}}
    writer.apply(Batch(1, offsets(5), [item("a", 4, "y", 1), Delete("items", "c", 5)]))
    assert state(store, "groups") == {"x": {"count": 1}, "y": {"count": 1}}
    writer.apply(Batch(2, offsets(6), [Delete("items", "b", 6)]))
    assert state(store, "groups") == {"y": {"count": 1}}
    # Re-sent (stale) writes do not reach the materializer: counts stay exact.
    writer.apply(Batch(3, offsets(8), [item("b", 2, "x", 1), item("c", 3, "y", 1)]))
    assert state(store, "groups") == {"y": {"count": 1}}


def test_find_sees_what_the_materializer_put_in_the_same_unit(spec: StoreSpec) -> None:
    """A materializer's own puts are found by lookup within the unit: a new key under its
    lookup, a key moved to another lookup value found there and no longer under the old."""
    found: list[dict[str, list[str]]] = []

    def derive(txn: StoreTxn, applied: Sequence[Applied]) -> None:
        if not any(change.write.key == "a" for change in applied):
            return
        assert [e.key for e in txn.find("items", "group", "z")] == []  # before the puts
        txn.put("items", "a-copy", {"group": "x", "v": 0})
        txn.put("items", "b", {"group": "z", "v": 0})
        found.append({g: [e.key for e in txn.find("items", "group", g)] for g in ("x", "y", "z")})

    store = build(replace(spec, view=spec.view + "-derived"), derive)
    try:
        writer = store.writer(store.live_generation(), live=True)
        writer.apply(Batch(0, offsets(2), [item("b", 1, "x", 1), item("c", 2, "y", 1)]))
        writer.apply(Batch(1, offsets(3), [item("a", 3, "x", 1)]))
        assert found == [{"x": ["a", "a-copy"], "y": ["c"], "z": ["b"]}]
        assert state(store)["b"] == {"group": "z", "v": 0}
    finally:
        store.close()


def test_count_is_the_number_find_returns_in_and_across_units(spec: StoreSpec) -> None:
    """``count`` of a lookup equals ``len(find)`` before and after the unit's own puts and
    deletes, for entries stored by earlier units and untouched by this one, for a key moved to
    another value, and for a value no entry holds."""
    seen: list[dict[str, tuple[int, int]]] = []

    def both(txn: StoreTxn) -> dict[str, tuple[int, int]]:
        return {
            g: (txn.count("items", "group", g), len(txn.find("items", "group", g)))
            for g in ("x", "y", "z", "none")
        }

    def derive(txn: StoreTxn, applied: Sequence[Applied]) -> None:
        seen.append(both(txn))
        if any(change.write.key == "d" for change in applied):
            txn.put("items", "e", {"group": "x", "v": 0})  # a new key
            txn.put("items", "a", {"group": "z", "v": 0})  # moved from x to z
            txn.delete("items", "b")  # gone from x
            seen.append(both(txn))

    store = build(replace(spec, view=spec.view + "-count"), derive)
    try:
        writer = store.writer(store.live_generation(), live=True)
        writer.apply(
            Batch(0, offsets(3), [item("a", 1, "x", 1), item("b", 2, "x", 1), item("c", 3, "y", 1)])
        )
        writer.apply(Batch(1, offsets(4), [item("d", 4, "y", 1)]))
        writer.apply(Batch(2, offsets(5), [item("f", 5, "y", 1)]))
        assert seen == [
            {"x": (2, 2), "y": (1, 1), "z": (0, 0), "none": (0, 0)},
            {"x": (2, 2), "y": (2, 2), "z": (0, 0), "none": (0, 0)},
            {"x": (1, 1), "y": (2, 2), "z": (1, 1), "none": (0, 0)},
            {"x": (1, 1), "y": (3, 3), "z": (1, 1), "none": (0, 0)},
        ]
    finally:
        store.close()


def test_a_failing_batch_leaves_neither_data_nor_ledger(store: ViewStore) -> None:
    gen = store.live_generation()
    writer = store.writer(gen, live=True)
    writer.apply(Batch(0, offsets(1), [item("a", 1, "x", 1)]))

    def crash(_batch_id: int) -> None:
        raise RuntimeError("crash just before the commit")

    failing = store.writer(gen, live=True, hooks=CommitHooks(before_commit=crash))
    with pytest.raises(RuntimeError, match="crash just before"):
        failing.apply(Batch(1, offsets(3), [item("a", 2, "y", 2), item("b", 3, "y", 1)]))
    failing.close()
    assert state(store) == {"a": {"group": "x", "v": 1}}
    assert state(store, "groups") == {"x": {"count": 1}}
    assert store.committed(gen).offsets == offsets(1)
    again = store.writer(gen, live=True)
    assert again.apply(Batch(1, offsets(3), [item("a", 2, "y", 2), item("b", 3, "y", 1)]))
    assert counts(store) == {"a": 2, "b": 1}
    assert state(store, "groups") == {"y": {"count": 2}}


def test_a_failing_gate_leaves_neither_data_nor_ledger_and_the_writer_goes_on(
    store: ViewStore,
) -> None:
    """The gate runs just before the commit (a view's primary store waits there for its other
    stores): when it fails, the store is as it was, and the same writer applies the batch on
    the next try."""
    gen = store.live_generation()
    writer = store.writer(gen, live=True)
    writer.apply(Batch(0, offsets(1), [item("a", 1, "x", 1)]))
    gated: list[str] = []

    def other_store_failed() -> None:
        gated.append("asked")
        raise RuntimeError("another store of the view failed")

    batch = Batch(1, offsets(3), [item("a", 2, "y", 2), item("b", 3, "y", 1)])
    with pytest.raises(RuntimeError, match="another store"):
        writer.apply(batch, gate=other_store_failed)
    assert gated == ["asked"]
    assert state(store) == {"a": {"group": "x", "v": 1}}
    assert state(store, "groups") == {"x": {"count": 1}}
    assert store.committed(gen).offsets == offsets(1)
    assert writer.apply(batch, gate=lambda: gated.append("passed"))
    assert gated == ["asked", "passed"]
    assert counts(store) == {"a": 2, "b": 1}
    assert state(store, "groups") == {"y": {"count": 2}}
    assert store.committed(gen).offsets == offsets(3)


def test_kill_9_between_data_and_ledger_leaves_neither(spec: StoreSpec, store: ViewStore) -> None:
    gen = store.live_generation()
    writer = store.writer(gen, live=True)
    writer.apply(Batch(0, offsets(1), [item("a", 1, "x", 1)]))
    writer.close()
    batch = {
        "generation": gen,
        "batch_id": 1,
        "offsets": offsets(3),
        "writes": [
            {"key": "a", "position": 2, "fields": {"group": "y", "v": 2}},
            {"key": "b", "position": 3, "fields": {"group": "y", "v": 1}},
        ],
    }
    import json

    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.integration.stores.backends",
            spec.to_json(),
            json.dumps(batch),
        ],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
    assert child.returncode == -9, child.stderr.decode()[-2000:]
    reopened = build(spec)
    try:
        assert state(reopened) == {"a": {"group": "x", "v": 1}}
        assert state(reopened, "groups") == {"x": {"count": 1}}
        assert reopened.committed(gen).offsets == offsets(1)
        again = reopened.writer(gen, live=True)
        assert again.apply(Batch(1, offsets(3), [item("a", 2, "y", 2), item("b", 3, "y", 1)]))
        again.close()
        assert counts(reopened) == {"a": 2, "b": 1}
        assert state(reopened, "groups") == {"y": {"count": 2}}
    finally:
        reopened.close()


def test_swap_is_atomic_for_readers_and_discard_leaves_live_alone(store: ViewStore) -> None:
    live = store.live_generation()
    store.writer(live, live=True).apply(
        Batch(0, offsets(2), [item(f"k{i}", 1, "old", i) for i in range(50)])
    )
    shadow = "g" + uuid.uuid4().hex[:10]
    store.prepare(shadow)
    assert shadow in store.generations()
    store.writer(shadow, live=False).apply(
        Batch(0, offsets(3), [item(f"k{i}", 2, "new", i) for i in range(40)])
    )
    assert {f["group"] for f in state(store).values()} == {"old"}
    assert len(state(store, generation=shadow)) == 40

    # Discarding another shadow changes nothing live.
    other = "g" + uuid.uuid4().hex[:10]
    store.prepare(other)
    store.writer(other, live=False).apply(Batch(0, offsets(1), [item("zz", 1, "other", 0)]))
    store.discard(other)
    assert other not in store.generations()
    assert len(state(store)) == 50 and {f["group"] for f in state(store).values()} == {"old"}

    old_view, new_view = (50, frozenset({"old"})), (40, frozenset({"new"}))

    def view_read() -> tuple[int, frozenset[str]]:
        snapshot = state(store)
        return len(snapshot), frozenset(f["group"] for f in snapshot.values())

    # The reader's answers: (ended before the swap began, began after the swap returned, answer).
    seen: list[tuple[bool, bool, tuple[int, frozenset[str]]]] = []
    problems: list[object] = []  # the reader's exceptions and answers of neither view whole
    stop, swapping, swapped = threading.Event(), threading.Event(), threading.Event()
    read_before, read_after = threading.Event(), threading.Event()

    def read() -> None:
        while not stop.is_set():
            after = swapped.is_set()
            try:
                answer = view_read()
            except Exception as exc:  # a failed read fails the test (after the join)
                problems.append(exc)
                continue
            before = not swapping.is_set()
            seen.append((before, after, answer))
            if answer not in (old_view, new_view):
                problems.append(answer)
            if before:
                read_before.set()
            elif after:
                read_after.set()

    reader = threading.Thread(target=read)
    reader.start()
    try:
        assert read_before.wait(30), problems  # the reader has read before the swap begins
        swapping.set()
        assert store.swap_in(shadow) == live
        swapped.set()
        assert read_after.wait(30), problems  # and again after the swap returned
    finally:
        stop.set()
        reader.join(30)
    assert not reader.is_alive()
    assert problems == []
    # Every read saw the old view whole or the new view whole: the old one until the swap
    # began, the new one once it had returned, either while it ran.
    assert {a for before, _, a in seen if before} == {old_view}
    assert {a for _, after, a in seen if after} == {new_view}
    assert {a for *_, a in seen} <= {old_view, new_view}
    assert [view_read() for _ in range(3)] == [new_view] * 3
    assert store.live_generation() == shadow
    assert store.committed(shadow).offsets == offsets(3)
    assert state(store, "groups") == {"new": {"count": 40}}


def test_a_live_writer_of_a_replaced_generation_stops(store: ViewStore) -> None:
    live = store.live_generation()
    writer = store.writer(live, live=True)
    writer.apply(Batch(0, offsets(1), [item("a", 1, "x", 1)]))
    shadow = "g" + uuid.uuid4().hex[:10]
    store.prepare(shadow)
    store.writer(shadow, live=False).apply(Batch(0, offsets(1), [item("a", 1, "x", 1)]))
    store.swap_in(shadow)
    with pytest.raises(StaleGenerationError):
        writer.apply(Batch(1, offsets(2), [item("b", 2, "x", 1)]))
    writer.close()
    assert state(store) == {"a": {"group": "x", "v": 1}}


def test_rejected_writes_are_reported_before_the_commit(store: ViewStore) -> None:
    """A store that refuses no value still calls nothing; the batch applies whole."""
    writer = store.writer(store.live_generation(), live=True)
    got: list[Rejected] = []
    assert writer.apply(Batch(0, offsets(1), [item("a", 1, "x", 1)]), on_rejected=got.extend)
    assert got == [] and state(store) == {"a": {"group": "x", "v": 1}}


# -- the write table (the columnar path) -------------------------------------------------


def _batches() -> list[Batch]:
    """A run of batches over every rule: inserts, folded changes, fresh writes, deletes,
    re-sent old writes, a key deleted and created again, fields inside a document's member,
    and a record too large for Kafka."""
    doc = JsonObject('{"op": "u", "after": {"group": "y", "v": 7}}', member="after")
    return [
        Batch(
            0,
            offsets(3),
            [
                item("a", 10, "x", 1, fresh=True),
                item("b", 11, "x", 2),
                item("c", 12, "y", 3, changes=(9, 12), fresh=True),
            ],
        ),
        Batch(
            1,
            offsets(6),
            [
                item("a", 20, "y", 4, changes=(15, 20)),
                Delete("items", "b", 21),
                Put("items", "d", 22, doc, fresh=True),
                Put("items", "big", 23, {"group": "z", "v": "x" * 1_100_000}),
            ],
        ),
        Batch(
            2,
            offsets(9),
            [
                item("a", 15, "z", 9, changes=(15,)),
                item("b", 11, "x", 2, fresh=True),
                Delete("items", "c", 5),
                Delete("items", "e", 30),
            ],
        ),
        Batch(
            3,
            offsets(12),
            [
                item("b", 40, "z", 5, changes=(35, 40), fresh=True),
                item("c", 41, "x", 1),
                Delete("items", "d", 42),
            ],
        ),
    ]


def test_a_write_table_applies_exactly_as_its_objects(spec: StoreSpec) -> None:
    """The same batches given as Put/Delete objects and as the Arrow write table leave the
    same entries, counts, derived state, rejections and ledger."""
    outcomes = []
    for columnar in (False, True):
        one = build(replace(spec, view=f"{spec.view}-{'t' if columnar else 'o'}"))
        try:
            writer = one.writer(one.live_generation(), live=True)
            rejected: list[Rejected] = []
            for batch in _batches():
                if columnar:
                    batch = replace(batch, writes=write_table(list(batch.writes)))
                assert writer.apply(batch, on_rejected=rejected.extend)
            writer.close()
            entries = {e.key: (e.fields, e.position, e.applied) for e in one.scan("items")}
            commit = one.committed(one.live_generation())
            outcomes.append(
                (
                    entries,
                    state(one, "groups"),
                    sorted((r.write.key, type(r.write).__name__) for r in rejected),
                    (commit.batch_id, commit.offsets, commit.batches),
                )
            )
        finally:
            one.close()
    assert outcomes[0] == outcomes[1]
    entries = outcomes[0][0]
    assert entries["a"] == ({"group": "y", "v": 4}, 20, 3)
    assert entries["b"] == ({"group": "z", "v": 5}, 40, 2)
    assert entries["c"] == ({"group": "x", "v": 1}, 41, 3)
    assert "d" not in entries and "e" not in entries


def test_an_arrow_batch_with_only_the_required_columns_applies(store: ViewStore) -> None:
    """A write table may leave out the optional columns (no changes, member, source)."""
    writer = store.writer(store.live_generation(), live=True)
    table = pa.table(
        {
            "collection": ["items", "items"],
            "key": ["a", "b"],
            "position": pa.array([5, 6], pa.int64()),
            "fields": ['{"group": "x", "v": 1}', '{"group": "x", "v": 2}'],
        }
    )
    assert writer.apply(Batch(0, offsets(2), table))
    writer.close()
    assert state(store) == {"a": {"group": "x", "v": 1}, "b": {"group": "x", "v": 2}}
    assert counts(store) == {"a": 1, "b": 1}
    assert state(store, "groups") == {"x": {"count": 2}}


# -- a restarted writer ---------------------------------------------------------------------


def test_a_new_writer_guards_from_what_the_store_holds(spec: StoreSpec, store: ViewStore) -> None:
    """A writer of a restarted job (a new store object) guards, counts and materializes from
    the store alone - for Kafka, from its state rebuilt out of the output topics, skipping the
    records of a batch that failed before its commit."""
    gen = store.live_generation()
    writer = store.writer(gen, live=True)
    writer.apply(
        Batch(
            0,
            offsets(3),
            [item("a", 10, "x", 1, fresh=True), item("b", 11, "x", 2), item("c", 12, "y", 1)],
        )
    )
    writer.apply(Batch(1, offsets(4), [Delete("items", "b", 20)]))
    writer.close()

    def crash(_batch_id: int) -> None:
        raise RuntimeError("crash just before the commit")

    failing = store.writer(gen, live=True, hooks=CommitHooks(before_commit=crash))
    with pytest.raises(RuntimeError):
        failing.apply(Batch(2, offsets(6), [item("a", 30, "q", 9), item("d", 31, "q", 9)]))
    failing.close()

    second = build(spec)
    try:
        again = second.writer(gen, live=True)
        assert again.apply(
            Batch(
                2,
                offsets(6),
                [
                    item("a", 25, "y", 2, changes=(10, 25)),  # 10 was applied: only 25 counts
                    item("b", 15, "x", 9, fresh=True),  # older than the delete: dropped
                    item("c", 12, "z", 9),  # re-sent: dropped
                    item("e", 26, "y", 1),
                ],
            )
        )
        again.close()
    finally:
        second.close()

    third = build(spec)
    try:
        last = third.writer(gen, live=True)
        assert last.apply(
            Batch(
                3, offsets(8), [item("a", 25, "q", 7), item("d", 3, "y", 1), item("e", 40, "x", 1)]
            )
        )
        last.close()
        assert {e.key: (e.fields, e.position, e.applied) for e in third.scan("items")} == {
            "a": ({"group": "y", "v": 2}, 25, 2),
            "c": ({"group": "y", "v": 1}, 12, 1),
            "d": ({"group": "y", "v": 1}, 3, 1),
            "e": ({"group": "x", "v": 1}, 40, 2),
        }
        assert state(third, "groups") == {"x": {"count": 1}, "y": {"count": 3}}
        assert third.committed(gen).offsets == offsets(8)
    finally:
        third.close()


# -- comparing generations (a verified rebuild) ---------------------------------------------


def test_generations_compare_by_key_and_digest(store: ViewStore) -> None:
    """A generation built batch by batch and one built from the same changes in one batch
    compare equal, derived entries included; changed, deleted and added entries of the live
    generation are then listed by key, with both entries."""
    live = store.live_generation()
    writer = store.writer(live, live=True)
    changes = [
        item("a", 1, "x", 1),
        item("b", 2, "x", 2),
        item("c", 3, "y", 3),
        Delete("items", "c", 4),
        item("d", 5, "y", 4),
    ]
    for i, change in enumerate(changes):
        assert writer.apply(Batch(i, offsets(i + 1), [change]))
    shadow = "g" + uuid.uuid4().hex[:10]
    store.prepare(shadow)
    store.writer(shadow, live=False).apply(
        Batch(0, offsets(5), [changes[0], changes[1], changes[3], changes[4]])
    )
    listed = list(store.digests(live))
    assert [(c, k) for c, k, _ in listed] == [
        ("groups", "x"),
        ("groups", "y"),
        ("items", "a"),
        ("items", "b"),
        ("items", "d"),
    ]
    assert listed == list(store.digests(shadow)) == list(store.digests())
    same = compare_generations(store, live, shadow)
    assert same.identical and same.same_positions and same.differences == []
    assert (same.live_entries, same.shadow_entries) == (5, 5)
    assert same.live_commit.offsets == same.shadow_commit.offsets == offsets(5)

    # The live generation moves on alone: a changed, a deleted and a new item (and through
    # the materializer a changed and a new group).
    writer.apply(
        Batch(
            5,
            offsets(6),
            [item("a", 10, "x", 99), Delete("items", "b", 11), item("e", 12, "z", 1)],
        )
    )
    writer.close()
    moved = compare_generations(store, live, shadow)
    assert not moved.identical and not moved.same_positions
    assert moved.different == 5 and (moved.live_entries, moved.shadow_entries) == (6, 5)
    found = {(d.collection, d.key): d for d in moved.differences}
    assert {ident: d.kind for ident, d in found.items()} == {
        ("groups", "x"): "different",
        ("groups", "z"): "missing in shadow",
        ("items", "a"): "different",
        ("items", "b"): "missing in live",
        ("items", "e"): "missing in shadow",
    }
    a = found[("items", "a")]
    assert a.live is not None and a.shadow is not None
    assert (a.live.fields, a.live.position) == ({"group": "x", "v": 99}, 10)
    assert (a.shadow.fields, a.shadow.position) == ({"group": "x", "v": 1}, 1)
    b = found[("items", "b")]
    assert b.live is None and b.shadow is not None and b.shadow.fields == {"group": "x", "v": 2}
    x = found[("groups", "x")].as_dict()
    assert (x["live"]["fields"], x["shadow"]["fields"]) == ({"count": 1}, {"count": 2})
    # A listing limit keeps the count whole.
    first = compare_generations(store, live, shadow, limit=2)
    assert first.different == 5 and len(first.differences) == 2
