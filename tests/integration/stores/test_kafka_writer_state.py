"""The Kafka store writer's compact state: what a writer keeps per key (position, applied count,
tombstone, where the latest record is, and the lookup indexes) is what a new writer rebuilds
from the output topics - over several partitions, with derived deletes and a failed batch's
records in the holes - and it guards, counts and materializes from it."""

import uuid
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from connectors.stores.kafka import KafkaStore
from connectors.stores.kafka_writer import KafkaWriter, WriterState
from connectors.stores.positions import GONE
from tests.integration.conftest import Endpoints
from tributary.view_model import Applied, Batch, Delete, Put
from tributary.view_store import Collection, CommitHooks, StoreTxn

TOPIC = "writer-state.source"
COLLECTIONS = (Collection("items", lookups=("group",)), Collection("groups"))


def offsets(end: int) -> dict[str, dict[str, int]]:
    return {TOPIC: {"0": end}}


def groups_of_items(txn: StoreTxn, applied: Sequence[Applied]) -> None:
    """Live items per group (found by the lookup); a group without items is deleted."""
    touched: set[str] = set()
    for change in applied:
        if change.before is not None:
            touched.add(str(change.before["group"]))
        if isinstance(change.write, Put):
            touched.add(str(change.write.fields["group"]))
    for group in sorted(touched):
        members = txn.find("items", "group", group)
        if members:
            txn.put("groups", group, {"count": len(members)})
        else:
            txn.delete("groups", group)


@pytest.fixture
def view(stack: Endpoints) -> Iterator[str]:
    name = f"state-{uuid.uuid4().hex[:8]}"
    yield name
    store = KafkaStore(stack.kafka, name, COLLECTIONS)
    topics = set(store.generation_topics(None).values()) & set(store.admin().topic_names())
    store.admin().delete(*sorted(topics))
    store.close()


def build(stack: Endpoints, view: str) -> KafkaStore:
    return KafkaStore(stack.kafka, view, COLLECTIONS, groups_of_items, partitions=3)


def snapshot(state: WriterState) -> dict[str, object]:
    """Per key what the guard reads, and the lookup index (slot order left out)."""
    out: dict[str, object] = {}
    for collection, index in state.keys.items():
        keys = index.keys().to_pylist()
        rows = {}
        for slot, key in enumerate(keys):
            if index.state[slot] != GONE:
                rows[key] = (
                    int(index.state[slot]),
                    int(index.position[slot]),
                    int(index.applied[slot]),
                    int(index.partition[slot]),
                    int(index.offset[slot]),
                )
        out[collection] = rows
    out["lookups"] = {k: {t: sorted(v) for t, v in idx.items()} for k, idx in state.lookups.items()}
    return out


def test_a_new_writer_rebuilds_the_state_its_predecessor_held(stack: Endpoints, view: str) -> None:
    store = build(stack, view)
    gen = store.live_generation()
    writer = store.writer(gen, live=True)
    assert isinstance(writer, KafkaWriter)
    n = 300
    writer.apply(
        Batch(0, offsets(1), [Put("items", f"k{i}", 10, {"group": f"g{i % 7}"}) for i in range(n)])
    )
    writer.apply(
        Batch(
            1,
            offsets(2),
            [Put("items", f"k{i}", 20, {"group": f"g{i % 5}"}, (15, 20)) for i in range(0, n, 2)]
            + [Delete("items", f"k{i}", 21) for i in range(1, n, 6)],
        )
    )
    # Every item of group g0 gone: the materializer deletes the group (a derived delete).
    g0 = [i for i in range(n) if (i % 5 == 0 and i % 2 == 0) or (i % 2 and i % 7 == 0)]
    writer.apply(Batch(2, offsets(3), [Delete("items", f"k{i}", 30) for i in g0]))

    def crash(_batch_id: int) -> None:
        raise RuntimeError("crash just before the commit")

    failing = store.writer(gen, live=True, hooks=CommitHooks(before_commit=crash))
    with pytest.raises(RuntimeError):
        failing.apply(
            Batch(3, offsets(4), [Put("items", f"k{i}", 99, {"group": "x"}) for i in range(50)])
        )
    failing.close()
    # The same batch again: its records follow the failed ones, which become holes.
    writer.apply(Batch(3, offsets(4), [Put("items", "k2", 40, {"group": "g1"})]))
    assert writer._state is not None
    held = snapshot(writer._state)
    writer.close()
    store.close()

    reopened = build(stack, view)
    try:
        again = reopened.writer(gen, live=True)
        assert isinstance(again, KafkaWriter)
        assert again.apply(Batch(4, offsets(5), []))
        assert again._state is not None
        assert snapshot(again._state) == held
        # It guards and counts from the rebuilt state, and the materializer reads entries back
        # from their records.
        assert again.apply(
            Batch(
                5,
                offsets(6),
                [
                    Put("items", "k4", 20, {"group": "x"}),  # not newer: dropped
                    Put("items", "k1", 21, {"group": "x"}, fresh=True),  # deleted at 21
                    Put("items", "k3", 50, {"group": "g9"}, (10, 50)),
                    Put("items", "k5", 51, {"group": "g9"}, (31, 51), fresh=True),
                ],
            )
        )
        again.close()
        k3 = reopened.get("items", "k3")
        assert k3 is not None and (k3.position, k3.applied) == (50, 2)
        k5 = reopened.get("items", "k5")
        assert k5 is not None and (k5.fields, k5.position, k5.applied) == ({"group": "g9"}, 51, 2)
        assert reopened.get("items", "k1") is None
        assert reopened.get("items", "k4") is not None
        groups = {e.key: e.fields["count"] for e in reopened.scan("groups")}
        items = reopened.scan("items")
        expected: dict[str, int] = {}
        for entry in items:
            expected[entry.fields["group"]] = expected.get(entry.fields["group"], 0) + 1
        assert groups == expected and "g0" not in groups and groups["g9"] == 2
        counts = np.array([e.applied for e in items])
        assert counts.min() >= 1
    finally:
        reopened.close()
