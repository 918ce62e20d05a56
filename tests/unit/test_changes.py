import json

import pytest

from tributary.changes import ChangeDecodeError, ChangeEvent


def test_decodes_an_update_with_its_position() -> None:
    value = json.dumps(
        {
            "before": None,
            "after": {"id": 3, "qty": 30},
            "source": {
                "lsn": 120,
                "txId": 9,
                "schema": "public",
                "table": "t",
                "snapshot": "false",
            },
            "op": "u",
        }
    ).encode()
    change = ChangeEvent.from_kafka("cdc.public.t", b'{"id":3}', value)
    assert change.key == {"id": 3}
    assert change.op == "u" and change.row == {"id": 3, "qty": 30}
    assert change.position == 120
    assert change.source is not None and change.source.tx_id == 9 and not change.source.snapshot
    assert not change.is_delete


def test_a_tombstone_takes_its_position_from_headers() -> None:
    change = ChangeEvent.from_kafka("t", b'{"id":1}', None, [("lsn", b"77"), ("txId", b"5")])
    assert change.is_tombstone and change.is_delete
    assert change.position == 77


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        (None, b"{}", "without a key"),
        (b"not json", b"{}", "key is not JSON"),
        (b'{"id":1}', b"[1]", "not a JSON object"),
        (b'{"id":1}', b'{"op":"x","source":{"lsn":1}}', "no valid op"),
        (b'{"id":1}', b'{"op":"c","source":{}}', "no source.lsn"),
    ],
)
def test_poison_records_say_what_is_wrong(key: bytes | None, value: bytes, reason: str) -> None:
    with pytest.raises(ChangeDecodeError, match=reason):
        ChangeEvent.from_kafka("t", key, value)
