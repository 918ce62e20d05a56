"""The Kafka store's pure parts: key placement, ledger records, holes, folding, and a batch's
unit (guard, materializer reads, what gets produced). No broker: the store object does no
I/O until a method that needs Kafka is called."""

import numpy as np
import pyarrow as pa
import pytest

from connectors.errors import StoreError
from connectors.kafka import KafkaConfig
from connectors.stores.kafka import KafkaStore, StoredRecord, fold, murmur2, partition_for
from connectors.stores.kafka_ledger import (
    GenerationRecord,
    Slot,
    gaps_between,
    hole_size,
    in_ranges,
    ledger_key,
    merge_ranges,
)
from connectors.stores.kafka_writer import Folded, KafkaUnit, KafkaWriter, WriterState
from connectors.stores.positions import ENTRY, GONE, NONE, TOMB
from connectors.stores.writes import WriteColumns
from tributary.view_model import (
    Batch,
    Delete,
    JsonObject,
    Put,
    Rejected,
    lookup_text,
    write_table,
)
from tributary.view_store import Collection, CommitHooks

COLLECTIONS = (Collection("items", lookups=("group",)), Collection("groups"))


def store(topics: dict[str, str] | None = None) -> KafkaStore:
    return KafkaStore(KafkaConfig("127.0.0.1:1"), "v", COLLECTIONS, topics=topics)


# -- placement and names ------------------------------------------------------------------


def test_murmur2_matches_the_java_client() -> None:
    # Kafka's own test vectors (org.apache.kafka.common.utils.UtilsTest#testMurmur2).
    cases = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107,
    }
    for data, signed in cases.items():
        assert murmur2(data) == signed & 0xFFFFFFFF


def test_a_key_lands_in_the_partition_the_java_client_picks() -> None:
    # Java: Utils.toPositive(Utils.murmur2(key)) % partitions (the sign bit masked, not abs):
    # the partitions of Kafka's test vectors above, worked out by hand for 7 and 12 partitions.
    expected = {
        b"21": (3, 0),
        b"foobar": (0, 6),
        b"a-little-bit-long-string": (1, 8),
        b"a-little-bit-longer-string": (0, 11),
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": (3, 5),
        b"abc": (4, 3),
    }
    for key, (of_7, of_12) in expected.items():
        assert (partition_for(key, 7), partition_for(key, 12)) == (of_7, of_12), key
        assert partition_for(key, 1) == 0


def test_keys_spread_over_every_partition_in_range() -> None:
    placed = [partition_for(f"key-{i}".encode(), 7) for i in range(200)]
    assert set(placed) == set(range(7))


def test_names_of_topics_and_ledger_keys() -> None:
    s = store()
    assert s.topic("items") == "views.v.items"
    assert s.topic("items", "g1") == "views.v.items.g1"
    assert ledger_key("v", None) == "v\x1flive"
    assert ledger_key("v", "g1") == "v\x1fg1"
    assert s.describe() == "kafka 127.0.0.1:1 views.v.*"
    custom = store(topics={"items": "items-state"})
    assert custom.topic("items", "g1") == "items-state.g1"
    assert custom.describe() == "kafka 127.0.0.1:1 items-state views.v.groups"


def test_bad_names_are_refused() -> None:
    with pytest.raises(StoreError, match="unknown collections"):
        store(topics={"nope": "x"})
    with pytest.raises(StoreError, match="valid Kafka topic name"):
        store(topics={"items": "a b"})
    with pytest.raises(StoreError, match="share a topic"):
        store(topics={"items": "views.v.groups"})
    with pytest.raises(StoreError, match="view name"):
        KafkaStore(KafkaConfig("x:1"), "a\x1fb", COLLECTIONS)
    with pytest.raises(StoreError, match="must be letters"):
        store().prepare("live")
    with pytest.raises(StoreError, match="must be letters"):
        store().prepare("g/1")
    with pytest.raises(StoreError, match="no collection"):
        store().collection("nope")


def test_lookup_text_matches_postgres_text_of_a_json_value() -> None:
    assert lookup_text("x") == "x"
    assert lookup_text(True) == "true"
    assert lookup_text(3) == "3"
    assert lookup_text(None) is None
    assert lookup_text({"a": 1}) == '{"a": 1}'


# -- offsets, bounds and holes --------------------------------------------------------------


def test_ranges_merge_and_answer_membership() -> None:
    assert merge_ranges([(5, 7), (0, 2), (2, 3), (6, 9), (4, 4)]) == [(0, 3), (5, 9)]
    ranges = [(0, 3), (5, 9)]
    assert [o for o in range(11) if in_ranges(ranges, o)] == [0, 1, 2, 5, 6, 7, 8]
    assert not in_ranges([], 0)


def test_gaps_between_the_bound_and_delivered_offsets_are_holes() -> None:
    assert gaps_between(10, [10, 11, 12]) == (13, [])
    # a crashed writer left 10..11; a stale writer's record interleaved at 14
    assert gaps_between(10, [12, 13, 15]) == (16, [(10, 12), (14, 15)])
    with pytest.raises(ValueError, match="below the bound"):
        gaps_between(10, [9, 11])


def test_a_commit_moves_bounds_of_written_partitions_only() -> None:
    record = GenerationRecord(
        "g", 3, {"s": {"0": 5}}, 4, {"t": {0: 10, 1: 4}}, {"t": {0: [(2, 3)]}}
    )
    bounds, holes = record.advanced({("t", 0): [12, 13], ("u", 0): [0, 1]})
    assert bounds == {"t": {0: 14, 1: 4}, "u": {0: 2}}
    assert holes == {"t": {0: [(2, 3), (10, 12)]}}
    assert hole_size(holes) - hole_size(record.holes) == 2
    assert record.bounds == {"t": {0: 10, 1: 4}}  # the record itself is unchanged
    with pytest.raises(ValueError, match=r"t\[1\]"):
        record.advanced({("t", 1): [3]})


def test_a_generation_record_round_trips_through_json() -> None:
    record = GenerationRecord(
        "g1", 7, {"src": {"0": 9, "1": 3}}, 8, {"t": {0: 10, 2: 4}}, {"t": {0: [(1, 2), (5, 7)]}}
    )
    text = record.to_json()
    assert GenerationRecord.from_json(text) == record
    assert GenerationRecord.from_json(text).to_json() == text
    assert GenerationRecord.from_json(GenerationRecord("g").to_json()) == GenerationRecord("g")
    assert record.commit("v").offsets == {"src": {"0": 9, "1": 3}}
    assert record.bound("t", 2) == 4 and record.bound("t", 1) == 0 and record.bound("x", 0) == 0
    with pytest.raises(ValueError):
        GenerationRecord.from_json(b'{"batch_id": 1}')


# -- records and folding --------------------------------------------------------------------


def test_a_slot_survives_its_headers() -> None:
    for slot in (Slot(b'{"a":1}', 12, 3), Slot(None, 40), Slot(None, None), Slot(b"{}", 0, 0)):
        assert Slot.of(slot.value, slot.headers("g", 5)) == slot
    names = [name for name, _ in Slot(b"{}", 1, 1).headers("g", 5)]
    assert names == [
        "tributary.position",
        "tributary.applied",
        "tributary.generation",
        "tributary.batch",
    ]


def test_the_later_record_of_a_key_wins() -> None:
    def rec(offset: int, key: str, slot: Slot) -> StoredRecord:
        return StoredRecord("t", 0, offset, key, slot)

    folded = fold(
        [
            rec(0, "a", Slot(b'{"v":1}', 1, 1)),
            rec(1, "b", Slot(b'{"v":1}', 2, 1)),
            rec(2, "a", Slot(b'{"v":2}', 3, 2)),
            rec(3, "b", Slot(None, 4)),  # a delete keeps its position
            rec(4, "c", Slot(b'{"v":1}', 5, 1)),
            rec(5, "c", Slot(None, None)),  # a derived delete keeps nothing
        ]
    )
    assert folded == {"a": Slot(b'{"v":2}', 3, 2), "b": Slot(None, 4)}


# -- the batch overlay ----------------------------------------------------------------------


def loaded(slots: dict[tuple[str, str], Slot]) -> tuple[KafkaWriter, WriterState]:
    """A writer whose state holds these committed slots (each at its own offset of partition
    0; the entries' values in the writer's cache, so nothing is read from Kafka)."""
    s = store()
    writer = KafkaWriter(s, "g1", live=True, hooks=CommitHooks())
    state = WriterState(s.collections)
    for offset, ((collection, key), slot) in enumerate(slots.items()):
        state_of = ENTRY if slot.value is not None else TOMB if slot.position is not None else GONE
        state.fold(
            collection,
            Folded(
                pa.array([key]),
                np.array([NONE if slot.position is None else slot.position]),
                np.array([slot.applied]),
                np.array([state_of], dtype=np.int8),
                np.array([0], dtype=np.int32),
                np.array([offset]),
                [slot.value],
            ),
        )
        if slot.value is not None:
            writer._cache.put((collection, key), (0, offset), slot.value)
    return writer, state


def unit_of(writer: KafkaWriter, state: WriterState) -> KafkaUnit:
    unit = KafkaUnit(writer, Batch(0, {}))
    unit._state = state
    return unit


def test_the_guard_drops_old_writes_and_counts_new_changes() -> None:
    slots = {
        ("items", "a"): Slot(b'{"group":"x"}', 10, 2),
        ("items", "b"): Slot(None, 30),  # deleted at 30
    }
    writes = [
        Put("items", "a", 14, {"group": "y"}, changes=(10, 12, 14)),
        Put("items", "b", 12, {"group": "x"}, fresh=True),  # an old insert of a deleted key
        Put("items", "c", 5, {"group": "x"}, fresh=True),
        Delete("items", "d", 7),  # a key never seen: its position is kept
    ]
    expected = {
        ("items", "a"): Slot(b'{"group":"y"}', 14, 4),
        ("items", "c"): Slot(b'{"group":"x"}', 5, 1),
        ("items", "d"): Slot(None, 7),
    }
    for materialized in (True, False):  # the overlay's path and the columns' path
        unit = unit_of(*loaded(slots))
        rejected: list[Rejected] = []
        applied = unit.write(WriteColumns.of(writes), rejected, materialized)
        assert rejected == []
        if materialized:
            assert [(a.write.key, a.before) for a in applied] == [
                ("a", {"group": "x"}),
                ("c", None),
                ("d", None),
            ]
        assert unit.records() == expected


def test_materializer_reads_see_the_units_writes() -> None:
    writer, state = loaded(
        {
            ("items", "a"): Slot(b'{"group":"x"}', 1, 1),
            ("items", "b"): Slot(b'{"group":"x"}', 2, 1),
            ("groups", "x"): Slot(b'{"count":2}', 0, 0),
        }
    )
    unit = unit_of(writer, state)
    writes = [Put("items", "a", 3, {"group": "y"}), Put("items", "c", 4, {"group": "x"})]
    unit.write(WriteColumns.of(writes), [], True)
    txn = unit.txn()
    assert sorted(e.key for e in txn.find("items", "group", "x")) == ["b", "c"]
    assert [e.key for e in txn.find("items", "group", "y")] == ["a"]
    assert txn.find("items", "group", None) == []
    with pytest.raises(StoreError, match="not a lookup"):
        txn.find("groups", "count", 1)
    txn.put("groups", "x", {"count": 2})  # unchanged: nothing to produce
    txn.put("groups", "y", {"count": 1})
    txn.delete("groups", "z")  # absent: nothing to produce
    got = txn.get("groups", "y")
    assert got is not None and (got.fields, got.position, got.applied) == ({"count": 1}, 0, 0)
    changes = dict(txn.changes())
    assert set(changes) == {("items", "a"), ("items", "c"), ("groups", "y")}
    txn.delete("groups", "x")
    assert dict(txn.changes())[("groups", "x")] == Slot(None, None)
    # the committed state is untouched until the writer folds the records in
    assert state.keys_with("items", "group", "x") == {"a", "b"}
    records = unit.records()
    for collection in ("items", "groups"):
        mine = {k: v for (c, k), v in records.items() if c == collection}
        state.fold(
            collection,
            Folded(
                pa.array(list(mine)),
                np.array([NONE if v.position is None else v.position for v in mine.values()]),
                np.array([v.applied for v in mine.values()]),
                np.array(
                    [
                        ENTRY if v.value is not None else TOMB if v.position is not None else GONE
                        for v in mine.values()
                    ],
                    dtype=np.int8,
                ),
                np.full(len(mine), -1, dtype=np.int32),
                np.full(len(mine), -1),
                [v.value for v in mine.values()],
            ),
        )
    assert state.keys_with("items", "group", "x") == {"b", "c"}
    assert state.slot_of("groups", "x")[0] == Slot(None, None)  # neither an entry nor a tomb


def test_fields_kafka_cannot_hold_are_rejected_before_the_materializer() -> None:
    writes = [Put("items", "big", 1, {"v": "x" * 1_000_000}), Put("items", "ok", 2, {"v": 1})]
    for materialized in (True, False):
        unit = unit_of(*loaded({}))
        rejected: list[Rejected] = []
        applied = unit.write(WriteColumns.of(writes), rejected, materialized)
        assert [r.write.key for r in rejected] == ["big"]
        assert "exceeds" in rejected[0].reason
        if materialized:
            assert [a.write.key for a in applied] == ["ok"]
        assert list(unit.records()) == [("items", "ok")]


def test_fields_that_are_not_a_json_object_are_rejected() -> None:
    writes = write_table(
        [
            Put("items", "list", 1, JsonObject("[1, 2]")),
            Put("items", "bad", 2, JsonObject('{"v": ')),
            Put("items", "member", 3, JsonObject('{"after": {"v": 1}}', "after")),
            Put("items", "ok", 4, JsonObject('{"v": 2}')),
        ]
    )
    unit = unit_of(*loaded({}))
    rejected: list[Rejected] = []
    unit.write(WriteColumns(writes), rejected, False)
    assert sorted(r.write.key for r in rejected) == ["bad", "list"]
    assert unit.records() == {
        ("items", "member"): Slot(b'{"v":1}', 3, 1),
        ("items", "ok"): Slot(b'{"v": 2}', 4, 1),
    }
