"""Reading Kafka for the Spark source with confluent-kafka: partition discovery, true end
offsets, and the exact, deterministic read of one offset range as Arrow record batches.

Everything here runs in Spark's Python processes (the planner and the executors): clients are
created inside the functions, never pickled.

How long the broker may hold a fetch (``fetch.wait.max.ms``) matters on Tansu: its fetch lists
every stored batch of the partition and stops listing when that time is up, so on a partition of
many small batches (a steady producer with a short linger writes tens per second) a short wait
lists only the first ones and a fetch further on comes back empty, below the high watermark,
forever: no record, no end-of-partition signal. A longer wait also makes each fetch hold that
long when the range ends before the log does (Tansu reads on until the wait is up). So a range
read starts with a short wait and, when a fetch brings nothing while records are due, opens the
consumer again at its position with a longer one (:data:`FETCH_WAITS_MS`); the wait that worked
is kept for the partition in this process (Spark reuses its Python workers). On Apache Kafka the
first wait serves. Tansu also reads on while the fetch's byte budget lasts, so a range read asks
for about the bytes its records need (:func:`fetch_budget`): a short live range comes back as
soon as it is there instead of after the whole wait.
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

from connectors.errors import KafkaError
from connectors.kafka.config import KafkaConfig
from connectors.kafka.fetching import (
    FETCH_WAITS_MS,
    SHORT_WAIT_MS,
    longer_wait,
    range_fetch,
    stall_s,
)
from connectors.kafka.offsets import TrueEnds, true_watermarks
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
PROBE_FETCH_WAIT_MS = SHORT_WAIT_MS  # end probes need only a fetch response's high watermark

_learned_wait: dict[tuple[str, str, int], int] = {}
"""Per (bootstrap servers, topic, partition): the fetch wait that last brought records."""


def source_consumer(options: KafkaSourceOptions, **overrides: str | int | bool) -> Consumer:
    """A group-less consumer for assigned reads (no JoinGroup, no offset commits)."""
    config = KafkaConfig(
        bootstrap_servers=options.bootstrap_servers,
        client_id="tributary-spark-source",
        extra={k: v for k, v in options.client.items() if k != "bootstrap.servers"},
    )
    props = config.client_properties(
        **{"group.id": "tributary-spark-source", "auto.offset.reset": "error"},
        **{
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": SHORT_WAIT_MS,
        },
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
    consumer: Consumer,
    partitions: list[TopicPartitionKey],
    timeout: float,
    options: KafkaSourceOptions,
    known: TrueEnds | None = None,
) -> tuple[dict[TopicPartitionKey, int], dict[TopicPartitionKey, int]]:
    """(earliest, true end) per partition: :func:`connectors.kafka.offsets.true_watermarks`
    (ListOffsets may under-report the end; the end is taken from the high watermark of a fetch
    response of a new consumer, which needs no record). ``consumer`` lists the offsets."""

    def probe() -> Consumer:
        return source_consumer(options, **{"fetch.wait.max.ms": PROBE_FETCH_WAIT_MS})

    try:
        marks = true_watermarks(consumer, partitions, timeout, fresh=probe, known=known)
    except KafkaError as exc:
        raise StreamingError(str(exc)) from exc
    return {tp: low for tp, (low, _) in marks.items()}, {
        tp: high for tp, (_, high) in marks.items()
    }


def read_range(options: KafkaSourceOptions, offset_range: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Exactly the records of ``[start, end)`` of one partition, in offset order.

    Offsets at or past ``end`` are never returned, so a range reads the same records every time.
    Gaps (compaction, transaction markers) are skipped; the end-of-partition signal closes a
    range whose last offsets hold no record. Raises :class:`DataLossError` when the start is no
    longer on the broker, unless ``failOnDataLoss=false``, and :class:`StreamingError` when no
    fetch brought anything for ``kafkaConsumer.pollTimeoutMs`` with the longest fetch wait.
    """
    topic, partition, end = offset_range.topic, offset_range.partition, offset_range.end
    key = (options.bootstrap_servers, topic, partition)
    wait = _learned_wait.get(key, FETCH_WAITS_MS[0])
    start = max(offset_range.start, 0)
    consumer = _range_consumer(options, wait, end - start)
    try:
        position = _checked_start(consumer, options, offset_range)
        read = _Read(position, options.poll_timeout_s)
        while position < end:
            consumer.assign([TopicPartition(topic, partition, position)])
            yield from _consume(consumer, options, offset_range, read, stall_s(wait))
            position = read.position
            if position >= end:
                break
            # A fetch brought nothing for a while: go on with a consumer with a longer wait.
            longer = longer_wait(wait)
            if time.monotonic() > read.deadline:
                raise StreamingError(
                    f"{topic}[{partition}]: no record for {options.poll_timeout_s:.0f}s at offset"
                    f" {position}, expected up to {end - 1} (broker down or range deleted?)"
                )
            wait = longer
            consumer.close()
            consumer = _range_consumer(options, wait, end - position)
        if read.got_records:
            _learned_wait[key] = wait
    finally:
        consumer.close()


def _range_consumer(options: KafkaSourceOptions, wait: int, records: int) -> Consumer:
    """A consumer for one range read. Never kept between reads: librdkafka 2.x crashes the
    process (a null topic name in its metadata cache) when a client it keeps idle refreshes the
    metadata of a topic deleted since it read it (tests/integration/analytics/test_live_path.py
    showed it on the local broker)."""
    return source_consumer(options, **range_fetch(wait, records))


class _Read:
    """Where a range read stands: its position, and until when it may go without a record."""

    def __init__(self, position: int, patience_s: float) -> None:
        self.position = position
        self.got_records = False
        self.deadline = time.monotonic() + patience_s


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
    consumer: Consumer, options: KafkaSourceOptions, r: OffsetRange, read: _Read, stall: float
) -> Iterator[pa.RecordBatch]:
    """Records from ``read.position`` up to the range's end; returns early (position below the
    end) when no fetch brought anything for ``stall`` seconds, for the caller to wait longer."""
    pending: list[Message] = []
    position = read.position
    quiet_until = time.monotonic() + stall
    try:
        while position < r.end:
            # Ask for no more than may still be there: consume() waits out its timeout when
            # fewer messages remain.
            messages = consumer.consume(min(r.end - position, 10_000), timeout=0.5)
            now = time.monotonic()
            if messages:
                quiet_until = now + stall
                read.deadline = now + options.poll_timeout_s
            elif now > quiet_until or now > read.deadline:
                break
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == RdKafkaError._PARTITION_EOF:
                        mine = message.partition() == r.partition and message.topic() == r.topic
                        if mine and (message.offset() or 0) >= r.end:
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
                if (
                    offset < position
                    or message.partition() != r.partition
                    or message.topic() != r.topic
                ):
                    continue  # fetched for an earlier assignment of a reused consumer
                if offset >= r.end:
                    position = r.end
                    break
                pending.append(message)
                position = offset + 1
                read.got_records = True
            read.position = position
            if len(pending) >= ROWS_PER_ARROW_BATCH:
                yield _batch(pending)
                pending = []
    finally:
        read.position = position
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
