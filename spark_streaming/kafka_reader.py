"""Reading Kafka for the Spark source with confluent-kafka: partition discovery, true end
offsets, and the exact, deterministic read of one offset range as Arrow record batches.

Everything here runs in Spark's Python processes (the planner and the executors): clients are
created inside the functions, never pickled.
"""

import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from connectors.kafka.config import KafkaConfig
from connectors.kafka.offsets import true_watermarks
from spark_streaming.errors import DataLossError, StreamingError
from spark_streaming.kafka_offsets import OffsetRange, TopicPartitionKey
from spark_streaming.kafka_options import EARLIEST, KafkaSourceOptions

KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("key", StringType()), StructField("value", BinaryType())])
            ),
        ),
    ]
)
ARROW_SCHEMA = to_arrow_schema(KAFKA_SCHEMA, timezone="UTC")
ROWS_PER_ARROW_BATCH = 8192


def source_consumer(options: KafkaSourceOptions, **overrides: str | int | bool) -> Consumer:
    """A group-less consumer for assigned reads (no JoinGroup, no offset commits)."""
    config = KafkaConfig(
        bootstrap_servers=options.bootstrap_servers,
        client_id="tributary-spark-source",
        extra={k: v for k, v in options.client.items() if k != "bootstrap.servers"},
    )
    props = config.client_properties(
        **{"group.id": "tributary-spark-source", "auto.offset.reset": "error"},
        **{"enable.auto.commit": False, "enable.partition.eof": True, "fetch.wait.max.ms": 10},
    )
    props.update(overrides)
    return Consumer(props)


def discover(
    consumer: Consumer, options: KafkaSourceOptions, timeout: float
) -> list[TopicPartitionKey]:
    """The topic-partitions the source reads now (subscribe list or pattern)."""
    try:
        metadata = consumer.list_topics(timeout=timeout)
    except Exception as exc:  # confluent_kafka.KafkaException
        raise StreamingError(f"cannot list topics at {options.bootstrap_servers}: {exc}") from exc
    found: list[TopicPartitionKey] = []
    for name, topic in metadata.topics.items():
        if name.startswith("__") or not options.matches(name) or topic.error is not None:
            continue
        found.extend((name, p) for p in topic.partitions)
    return sorted(found)


def watermarks(
    consumer: Consumer, partitions: list[TopicPartitionKey], timeout: float
) -> tuple[dict[TopicPartitionKey, int], dict[TopicPartitionKey, int]]:
    """(earliest, true end) per partition; the end is read from a fetch response."""
    marks = true_watermarks(consumer, partitions, timeout)
    return {tp: m[0] for tp, m in marks.items()}, {tp: m[1] for tp, m in marks.items()}


def read_range(options: KafkaSourceOptions, offset_range: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Exactly the records of ``[start, end)`` of one partition, in offset order.

    Offsets at or past ``end`` are never returned, so a range reads the same records every time.
    Gaps (compaction, transaction markers) are skipped; the end-of-partition signal closes a
    range whose last offsets hold no record. Raises :class:`DataLossError` when the start is no
    longer on the broker, unless ``failOnDataLoss=false``.
    """
    topic, partition, end = offset_range.topic, offset_range.partition, offset_range.end
    consumer = source_consumer(options)
    try:
        start = _checked_start(consumer, options, offset_range)
        if start < end:
            consumer.assign([TopicPartition(topic, partition, start)])
            yield from _consume(consumer, options, offset_range, start)
    finally:
        consumer.close()


def _checked_start(consumer: Consumer, options: KafkaSourceOptions, r: OffsetRange) -> int:
    """Where a range starts: its start, unless the broker no longer has it. Only ``EARLIEST``
    asks the broker; a deleted start shows up as an out-of-range fetch (see ``_consume``)."""
    if r.start != EARLIEST:
        return r.start
    low, _ = consumer.get_watermark_offsets(
        TopicPartition(r.topic, r.partition), timeout=options.poll_timeout_s
    )
    return int(low)


def _out_of_range(consumer: Consumer, options: KafkaSourceOptions, r: OffsetRange, at: int) -> int:
    """The start after an out-of-range fetch: a data-loss error, or the log's first offset."""
    low, _ = consumer.get_watermark_offsets(
        TopicPartition(r.topic, r.partition), timeout=options.poll_timeout_s
    )
    if at < low:
        if options.fail_on_data_loss:
            raise DataLossError(
                f"{r.topic}[{r.partition}]: offsets {at}..{low - 1} are no longer on the"
                " broker. Set failOnDataLoss=false to skip them."
            )
        return int(low)
    raise StreamingError(
        f"{r.topic}[{r.partition}]: offset {at} is out of range (the log starts at {low})"
    )


def _consume(
    consumer: Consumer, options: KafkaSourceOptions, r: OffsetRange, start: int
) -> Iterator[pa.RecordBatch]:
    pending: list[Message] = []
    position = start
    deadline = time.monotonic() + options.poll_timeout_s
    while position < r.end:
        messages = consumer.consume(min(r.end - position, 10_000), timeout=0.5)
        if messages:
            deadline = time.monotonic() + options.poll_timeout_s
        elif time.monotonic() > deadline:
            raise StreamingError(
                f"{r.topic}[{r.partition}]: no record for {options.poll_timeout_s:.0f}s at offset"
                f" {position}, expected up to {r.end - 1} (broker down or range deleted?)"
            )
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == RdKafkaError._PARTITION_EOF:
                    if (message.offset() or 0) >= r.end:
                        position = r.end
                    continue
                if error.code() in (
                    RdKafkaError._AUTO_OFFSET_RESET,
                    RdKafkaError.OFFSET_OUT_OF_RANGE,
                ):
                    position = _out_of_range(consumer, options, r, position)
                    consumer.assign([TopicPartition(r.topic, r.partition, position)])
                    break
                raise StreamingError(
                    f"{r.topic}[{r.partition}] fetch failed at {position}: {error.str()}"
                )
            offset = message.offset() or 0
            if offset >= r.end:
                position = r.end
                break
            pending.append(message)
            position = offset + 1
        if len(pending) >= ROWS_PER_ARROW_BATCH:
            yield _batch(pending)
            pending = []
    if pending:
        yield _batch(pending)


def _batch(messages: list[Message]) -> pa.RecordBatch:
    """Column-wise conversion of consumed messages (one pass per column is the fast path)."""
    stamps = [m.timestamp() for m in messages]
    headers: list[Any] = [m.headers() for m in messages]
    columns = [
        [m.key() for m in messages],
        [m.value() for m in messages],
        [m.topic() for m in messages],
        [m.partition() for m in messages],
        [m.offset() for m in messages],
        [None if ts < 0 else ts * 1000 for _, ts in stamps],
        [max(0, kind - 1) for kind, _ in stamps],
        [None if h is None else [{"key": k, "value": v} for k, v in h] for h in headers],
    ]
    return pa.RecordBatch.from_arrays(
        [pa.array(values, type=f.type) for values, f in zip(columns, ARROW_SCHEMA, strict=True)],
        schema=ARROW_SCHEMA,
    )
