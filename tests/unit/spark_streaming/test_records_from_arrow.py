"""Batches of the Kafka source become KafkaRecords the projections understand."""

import datetime as dt

import pyarrow as pa  # type: ignore[import-untyped]

from spark_streaming.kafka_reader import ARROW_SCHEMA
from spark_streaming.view_job import records_from_arrow


def test_arrow_rows_become_records_with_headers_and_timestamps() -> None:
    when = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    table = pa.Table.from_pylist(
        [
            {
                "key": b"k",
                "value": None,
                "topic": "t",
                "partition": 1,
                "offset": 7,
                "timestamp": when,
                "timestampType": 0,
                "headers": [{"key": "lsn", "value": b"42"}],
            },
            {
                "key": None,
                "value": b"v",
                "topic": "t",
                "partition": 0,
                "offset": 3,
                "timestamp": None,
                "timestampType": 0,
                "headers": None,
            },
        ],
        schema=ARROW_SCHEMA,
    )
    first, second = records_from_arrow(table)
    assert (first.topic, first.partition, first.offset, first.key, first.value) == (
        "t",
        1,
        7,
        b"k",
        None,
    )
    assert first.headers == (("lsn", b"42"),)
    assert first.timestamp_ms == int(when.timestamp() * 1000)
    assert second.headers == () and second.timestamp_ms is None
    assert records_from_arrow(table.slice(0, 0)) == []
