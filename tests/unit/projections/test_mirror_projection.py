"""The mirror's fold, engine-free: one write per key, stale changes dropped, rejects reported."""

import json

from projections.mirror import MirrorProjection, MirrorWrite, decode_change
from projections.view import KafkaRecord, project_batch

TOPIC = "cdc.public.t"


def change(
    offset: int, key: int, op: str | None, lsn: int, after: dict[str, object] | None = None
) -> KafkaRecord:
    k = json.dumps({"id": key}).encode()
    if op is None:
        return KafkaRecord(TOPIC, 0, offset, k, None, (("lsn", str(lsn).encode()),))
    envelope = {"op": op, "before": None, "after": after, "source": {"lsn": lsn, "txId": 1}}
    return KafkaRecord(TOPIC, 0, offset, k, json.dumps(envelope).encode())


def fold(*records: KafkaRecord) -> tuple[dict[int, MirrorWrite], list[str]]:
    batch = project_batch(list(records), decode_change, MirrorProjection())
    writes = {int(w.key["id"]): w for w in batch.writes}
    return writes, [r.reason for r in batch.rejections]


def test_updates_fold_into_the_latest_row_counting_each_change() -> None:
    writes, rejected = fold(
        change(0, 1, "c", 10, {"id": 1, "v": "a"}),
        change(1, 1, "u", 11, {"id": 1, "v": "b"}),
        change(2, 1, "u", 12, {"id": 1, "v": "c"}),
    )
    assert rejected == []
    assert writes[1] == MirrorWrite({"id": 1}, {"id": 1, "v": "c"}, 12, True, [10, 11, 12])


def test_a_delete_and_its_tombstone_become_one_delete() -> None:
    writes, _ = fold(
        change(0, 1, "u", 10, {"id": 1}),
        change(1, 1, "d", 11),
        change(2, 1, None, 11),
    )
    assert writes[1].is_delete and writes[1].position == 11


def test_reinsert_after_delete_restarts_the_row() -> None:
    writes, _ = fold(
        change(0, 1, "u", 10, {"id": 1, "v": "a"}),
        change(1, 1, "d", 11),
        change(2, 1, None, 11),
        change(3, 1, "c", 12, {"id": 1, "v": "new"}),
        change(4, 1, "u", 13, {"id": 1, "v": "newer"}),
    )
    assert writes[1] == MirrorWrite({"id": 1}, {"id": 1, "v": "newer"}, 13, True, [12, 13])


def test_stale_positions_in_a_batch_are_dropped() -> None:
    writes, _ = fold(
        change(0, 1, "c", 10, {"id": 1, "v": "a"}),
        change(1, 1, "u", 20, {"id": 1, "v": "b"}),
        change(2, 1, "u", 15, {"id": 1, "v": "stale"}),  # re-sent old record
        change(3, 1, "c", 10, {"id": 1, "v": "a"}),
    )
    assert writes[1].row == {"id": 1, "v": "b"} and writes[1].applied == [10, 20]


def test_batches_are_folded_in_offset_order_whatever_the_input_order() -> None:
    writes, _ = fold(
        change(1, 1, "u", 11, {"id": 1, "v": "b"}),
        change(0, 1, "c", 10, {"id": 1, "v": "a"}),
    )
    assert writes[1].row == {"id": 1, "v": "b"}


def test_unusable_records_are_rejected_with_a_reason_and_the_rest_is_kept() -> None:
    writes, rejected = fold(
        KafkaRecord(TOPIC, 0, 0, b'{"id": 1}', b"garbage"),
        KafkaRecord(TOPIC, 0, 1, None, b"{}"),
        change(2, 2, "u", 5, None),
        change(3, 3, "u", 6, {"name": "no key column"}),
        change(4, 4, "t", 7, None),
        change(5, 5, "c", 8, {"id": 5}),
    )
    assert list(writes) == [5]
    assert len(rejected) == 5
    assert "not JSON" in rejected[0] and "without a key" in rejected[1]
    assert "without an 'after' row" in rejected[2] and "key column" in rejected[3]
    assert "does not change a row" in rejected[4]


def test_next_offsets_per_partition_are_reported() -> None:
    batch = project_batch(
        [change(7, 1, "c", 1, {"id": 1}), KafkaRecord("other", 2, 41, None, None)],
        decode_change,
        MirrorProjection(),
    )
    assert batch.offsets == {TOPIC: {"0": 8}, "other": {"2": 42}}
    assert batch.records == 2
