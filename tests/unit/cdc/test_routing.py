import json

import pytest

from cdc.errors import PublishError
from cdc.routing import ChangeRouter, source_position


def _envelope(op: str, lsn: int | None, tx: int | None, row: dict[str, object] | None) -> str:
    source = {"schema": "public", "table": "t", "txId": tx, "lsn": lsn, "snapshot": "false"}
    if lsn is None:
        source["sequence"] = json.dumps(["100", "90"])
    return json.dumps(
        {"before": None, "after": row, "source": source, "op": op, "ts_ms": 1},
        separators=(",", ":"),
    )


def test_source_position_reads_the_envelope_not_the_row() -> None:
    value = _envelope("c", 42, 7, {"id": 1, "lsn": 999, "source": "x"})
    assert source_position(value) == (b"42", b"7")


def test_incremental_snapshot_reads_take_their_position_from_the_sequence() -> None:
    assert source_position(_envelope("r", None, None, {"id": 1})) == (b"100", None)


def test_a_tombstone_carries_its_deletes_position() -> None:
    router = ChangeRouter()
    [delete] = router.route("cdc.public.t", '{"id":1}', _envelope("d", 50, 9, None))
    [tombstone] = router.route("cdc.public.t", '{"id":1}', None)
    assert tombstone.value is None
    assert tombstone.key == b'{"id":1}'
    assert tombstone.headers == delete.headers == [("lsn", b"50"), ("txId", b"9")]
    assert router.last_lsn == 50


def test_internal_topics_are_skipped_and_heartbeats_have_no_position() -> None:
    router = ChangeRouter(
        skip_topics=frozenset({"cdc.tributary_cdc.debezium_signal"}),
        unpositioned_topics=frozenset({"__debezium-heartbeat.cdc"}),
    )
    assert router.route("cdc.tributary_cdc.debezium_signal", '{"id":"a"}', "{}") == []
    [beat] = router.route("__debezium-heartbeat.cdc", '{"serverName":"cdc"}', '{"ts_ms":1}')
    assert beat.headers == []


def test_a_change_without_position_is_an_error_naming_the_topic() -> None:
    with pytest.raises(PublishError, match=r"cdc\.public\.t"):
        ChangeRouter().route("cdc.public.t", '{"id":1}', '{"op":"c","source":{}}')
