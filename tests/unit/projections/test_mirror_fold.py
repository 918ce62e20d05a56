"""The mirror's columnar fold: one write per key, positions folded, bad records rejected."""

import json
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from connectors.postgres import SourceColumn
from projections.mirror import debezium_encoding, fold_changes, mirror_table
from projections.view import writes_from_folded
from spark_streaming.kafka_reader import ARROW_SCHEMA
from tributary.view_model import Delete, JsonObject, Put

TOPIC = "cdc.public.t"
Record = dict[str, Any]


def change(
    offset: int, key: int | None, op: str | None, lsn: int | None, after: Any = None, **source: Any
) -> Record:
    k = None if key is None else json.dumps({"id": key}).encode()
    headers = []
    value = None
    if op is None:
        if lsn is not None:
            headers = [{"key": "lsn", "value": str(lsn).encode()}]
    else:
        envelope = {"op": op, "before": None, "after": after, "source": {"lsn": lsn, **source}}
        value = json.dumps(envelope).encode()
    return {
        "key": k,
        "value": value,
        "topic": TOPIC,
        "partition": 0,
        "offset": offset,
        "timestamp": None,
        "timestampType": 0,
        "headers": headers,
    }


def raw(offset: int, key: bytes | None, value: bytes | None) -> Record:
    return {**change(offset, 1, "c", 1, {}), "key": key, "value": value}


def fold(*records: Record) -> tuple[dict[int, Put | Delete], dict[int, str]]:
    table = pa.Table.from_pylist(list(records), schema=ARROW_SCHEMA)
    out = pa.Table.from_batches(list(fold_changes(table.to_batches())))
    writes, dead = writes_from_folded(out)
    return (
        {json.loads(w.key)["id"]: w for w in writes},
        {d.offset: d.reason for d in dead},
    )


def test_updates_fold_into_the_latest_row_counting_each_change() -> None:
    writes, dead = fold(
        change(0, 1, "c", 10, {"id": 1, "v": "a"}),
        change(1, 1, "u", 11, {"id": 1, "v": "b"}),
        change(2, 2, "u", 5, {"id": 2, "v": "x"}),
        change(3, 1, "u", 12, {"id": 1, "v": "c"}),
    )
    assert dead == {}
    one = writes[1]
    assert isinstance(one, Put)
    assert (one.position, one.changes, one.fresh) == (12, (10, 11, 12), True)
    assert dict(one.fields) == {"id": 1, "v": "c"}
    assert isinstance(one.fields, JsonObject) and one.fields.member == "after"
    assert one.source is not None and one.source.offset == 3
    two = writes[2]
    assert isinstance(two, Put) and (two.changes, two.fresh) == ((5,), False)


def test_a_delete_and_its_tombstone_become_one_delete() -> None:
    writes, dead = fold(
        change(0, 1, "u", 10, {"id": 1}), change(1, 1, "d", 11), change(2, 1, None, 11)
    )
    assert dead == {}
    assert writes[1] == Delete("rows", '{"id": 1}', 11, writes[1].source)


def test_reinsert_after_delete_restarts_the_row() -> None:
    writes, _ = fold(
        change(0, 1, "u", 10, {"id": 1, "v": "a"}),
        change(1, 1, "d", 11),
        change(2, 1, None, 11),
        change(3, 1, "c", 12, {"id": 1, "v": "b"}),
        change(4, 1, "u", 13, {"id": 1, "v": "c"}),
    )
    put = writes[1]
    assert isinstance(put, Put) and (put.changes, put.fresh) == ((12, 13), True)


def test_order_is_by_position_and_duplicates_count_once() -> None:
    # A re-sent stretch inside one batch: positions 10, 11 arrive again after 12.
    writes, _ = fold(
        change(0, 1, "c", 10, {"id": 1, "v": "a"}),
        change(1, 1, "u", 11, {"id": 1, "v": "b"}),
        change(2, 1, "u", 12, {"id": 1, "v": "c"}),
        change(3, 1, "c", 10, {"id": 1, "v": "a"}),
        change(4, 1, "u", 11, {"id": 1, "v": "b"}),
    )
    put = writes[1]
    assert isinstance(put, Put)
    assert (put.position, put.changes, dict(put.fields)) == (12, (10, 11, 12), {"id": 1, "v": "c"})


def test_incremental_snapshot_reads_take_the_position_of_their_sequence() -> None:
    writes, dead = fold(
        change(0, 1, "r", None, {"id": 1}, sequence='["100","250"]'),
    )
    assert dead == {} and writes[1].position == 250


def test_records_that_are_not_changes_are_rejected_with_the_reason() -> None:
    writes, dead = fold(
        change(0, 1, "c", 10, {"id": 1}),
        raw(1, b'{"id": 2}', b"not json at all"),
        change(2, 3, "x", 11, {"id": 3}),
        change(3, 4, "u", 12, None),
        change(4, None, "c", 13, {"id": 5}),
        change(5, 6, "t", 14, None),
        raw(6, b"[1]", json.dumps({"op": "c", "after": {}, "source": {"lsn": 1}}).encode()),
        change(7, 7, "u", None, {"id": 7}),
        change(8, 8, None, None),  # a tombstone without position only confirms a delete
    )
    assert set(writes) == {1}
    assert "value is not JSON" in dead[1]
    assert "no valid op (got 'x')" in dead[2]
    assert "without an 'after' row object" in dead[3]
    assert "without a key" in dead[4]
    assert "does not change a row" in dead[5]
    assert "key is not a JSON object" in dead[6]
    assert "no source.lsn" in dead[7]
    assert 8 not in dead


def column(name: str, type_name: str, precision: int | None = None, category: str = "N") -> Any:
    return SourceColumn(name, type_name, type_name, category, precision, name == "id")


def test_each_source_type_gets_debeziums_json_encoding() -> None:
    assert debezium_encoding(column("a", "int4")) == "json"
    assert debezium_encoding(column("a", "numeric")) == "json"
    assert debezium_encoding(column("a", "timestamptz")) == "json"
    assert debezium_encoding(column("a", "timestamp", 3)) == "epoch_millis"
    assert debezium_encoding(column("a", "timestamp")) == "epoch_micros"
    assert debezium_encoding(column("a", "date")) == "epoch_days"
    assert debezium_encoding(column("a", "time")) == "micros_of_day"
    assert debezium_encoding(column("a", "jsonb")) == "json_text"
    assert debezium_encoding(column("a", "bytea")) == "base64"
    assert debezium_encoding(column("a", "_text", category="A")) == "json_array"


def test_the_mirror_layout_is_read_from_the_catalog_when_needed() -> None:
    reads: list[int] = []

    def catalog() -> list[SourceColumn]:
        reads.append(1)
        return [column("id", "int8"), column("tags", "_text", category="A")]

    layout = mirror_table("public_t", catalog)
    assert reads == [] and layout.columns == ()
    assert layout.refresh is not None
    resolved = layout.refresh()
    assert resolved.key == ("id",)
    assert [(c.name, c.encoding) for c in resolved.columns] == [
        ("id", "json"),
        ("tags", "json_array"),
    ]


def test_blank_and_multi_line_values_are_found_by_the_slow_path() -> None:
    writes, dead = fold(
        change(0, 1, "c", 10, {"id": 1}),
        raw(1, b'{"id": 2}', b""),
        raw(2, b'{"id": 3}', b"   "),
        raw(3, b'{"id": 4}', b'{"op": "c",\n "after": {"id": 4}, "source": {"lsn": 20}}'),
    )
    assert set(writes) == {1, 4}
    assert "value is not JSON" in dead[1] and "value is not JSON" in dead[2]
