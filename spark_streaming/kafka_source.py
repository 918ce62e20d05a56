"""The project's Kafka source on Spark 4's Python Data Source API (used when Spark's own Kafka
connector jar is not on the classpath).

Same columns and option names as Spark's connector. The planner side (``latestOffset``,
``partitions``) discovers partitions and reads true end offsets; each micro-batch is one
:class:`KafkaRange` per partition, read by executors with assigned consumers. Offsets live only
in Spark's checkpoint.
"""

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from connectors.kafka.offsets import TrueEnds
from projections.folding import FOLDED_SCHEMA
from projections.view import PartitionFold
from spark_streaming.kafka_offsets import (
    OffsetRange,
    Offsets,
    TopicPartitionKey,
    check_data_loss,
    data_loss_error,
    flatten,
    nest,
    plan_end,
    plan_ranges,
)
from spark_streaming.kafka_options import EARLIEST, LATEST, KafkaSourceOptions
from spark_streaming.kafka_reader import (
    KAFKA_SCHEMA,
    discover,
    read_range,
    source_consumer,
    watermarks,
)

SOURCE_NAME = "tributary_kafka"
DISCOVERY_INTERVAL_S = 5.0  # new topics and partitions are found within this many seconds
SMALL_BATCH = 20_000  # a micro-batch spanning at most this many offsets is read by one task


def known_span(ranges: Sequence[OffsetRange]) -> int:
    """Offsets the ranges span (a range from the earliest offset counts as large)."""
    return sum(r.end - r.start if r.start >= 0 else SMALL_BATCH + 1 for r in ranges)


FOLDED_STRUCT = from_arrow_schema(FOLDED_SCHEMA)


class KafkaRange(InputPartition):
    """The offset ranges one Spark task reads (pickled to an executor): one Kafka partition's
    range, or, for a small micro-batch, every range of the batch (one task instead of one per
    partition: a task costs tens of milliseconds however few records it reads)."""

    def __init__(self, ranges: Sequence[OffsetRange]) -> None:
        super().__init__(tuple(ranges))
        self.ranges = tuple(ranges)


class KafkaDataSource(DataSource):
    """``readStream.format("tributary_kafka")``: Kafka records as Spark's connector has them."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType | str:
        options = KafkaSourceOptions.parse(dict(self.options))
        if options.fold is None:
            return KAFKA_SCHEMA
        if options.fold_schema is not None:
            return options.fold_schema  # a DDL string (Spark parses it)
        return FOLDED_STRUCT

    def streamReader(self, schema: StructType) -> "KafkaStreamReader":
        return KafkaStreamReader(KafkaSourceOptions.parse(dict(self.options)))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches over Kafka offsets; reads each range exactly."""

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        self._consumer: Any = None
        self._target: dict[TopicPartitionKey, int] | None = None
        self._partitions: list[TopicPartitionKey] | None = None
        self._discovered_at = 0.0
        self._latest: Offsets | None = None
        self._ends = TrueEnds()  # a trigger on an idle topic lists offsets, no new probe

    # -- planner side ------------------------------------------------------------------

    def _client(self) -> Any:
        if self._consumer is None:
            self._consumer = source_consumer(self.options)
        return self._consumer

    def _marks(self) -> tuple[dict[TopicPartitionKey, int], dict[TopicPartitionKey, int]]:
        consumer = self._client()
        now = time.monotonic()
        if self._partitions is None or now - self._discovered_at > DISCOVERY_INTERVAL_S:
            self._partitions = discover(consumer, self.options, self.options.poll_timeout_s)
            self._discovered_at = now
        return watermarks(
            consumer, self._partitions, self.options.poll_timeout_s, self.options, self._ends
        )

    def initialOffset(self) -> Offsets:
        lows, highs = self._marks()
        starting = self.options.starting
        if starting == "earliest":
            return nest(lows)
        if starting == "latest":
            return nest(highs)
        given = flatten(starting)
        resolved: dict[TopicPartitionKey, int] = {}
        for tp, high in highs.items():
            offset = given.get(tp, EARLIEST)
            resolved[tp] = lows[tp] if offset == EARLIEST else high if offset == LATEST else offset
        return nest(resolved)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        lows, highs = self._marks()
        stop_at = self.options.stop_at
        if stop_at is not None:
            # Exactly the given offsets (a partition not named: none of its records).
            given = flatten(stop_at)
            highs = {tp: min(h, max(lows[tp], given.get(tp, lows[tp]))) for tp, h in highs.items()}
        self._target = highs

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        lows, highs = self._marks()
        problems = check_data_loss(start, lows, highs)
        if problems and self.options.fail_on_data_loss:
            raise data_loss_error(problems)
        latest = dict(highs)
        if self._target is not None:
            # availableNow: nothing past the ends seen when the query started
            latest = {
                tp: min(h, self._target[tp]) for tp, h in latest.items() if tp in self._target
            }
        if not self.options.fail_on_data_loss:
            gone = {tp for tp in flatten(start) if tp not in highs}
            start = nest({tp: o for tp, o in flatten(start).items() if tp not in gone})
        self._latest = nest(highs)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return plan_end(start, latest, max_rows)

    def reportLatestOffset(self) -> Offsets | None:
        return self._latest

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[KafkaRange]:
        ranges = plan_ranges(start, end, self.options.fail_on_data_loss)
        if len(ranges) > 1 and known_span(ranges) <= SMALL_BATCH:
            return [KafkaRange(ranges)]
        return [KafkaRange([r]) for r in ranges]

    def commit(self, end: Offsets) -> None:
        """Offsets stay in Spark's checkpoint only: nothing to commit to Kafka."""

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # -- executor side -----------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange)
        for offset_range in partition.ranges:
            yield from self._read_one(offset_range)

    def _read_one(self, offset_range: OffsetRange) -> Iterator[pa.RecordBatch]:
        skip = self.options.skip_below.get(offset_range.topic, {}).get(str(offset_range.partition))
        if skip is not None and skip > offset_range.start:
            offset_range = replace(offset_range, start=min(skip, offset_range.end))
        records = read_range(self.options, offset_range)
        if self.options.fold is None:
            return records
        # Each Kafka partition is folded alone: keys never span partitions.
        fold = PartitionFold(
            self.options.fold,
            tuple(sorted(self.options.fold_options.items())),
            self.options.fold_schema,
        )
        if self.options.stage_times is None:
            return fold.function()(records)
        return self._timed(offset_range, records, fold)

    def _timed(
        self, offset_range: OffsetRange, records: Iterator[pa.RecordBatch], fold: PartitionFold
    ) -> Iterator[pa.RecordBatch]:
        """The fold of a range, with the time spent reading Kafka and folding appended as one
        JSON line to ``tributary.stageTimes`` (a benchmark's view of the read task)."""
        began = time.perf_counter()
        batches = list(records)
        read_s = time.perf_counter() - began
        began = time.perf_counter()
        out = list(fold.function()(batches))
        fold_s = time.perf_counter() - began
        line = {
            "topic": offset_range.topic,
            "partition": offset_range.partition,
            "records": sum(b.num_rows for b in batches),
            "rows": sum(b.num_rows for b in out),
            "read_s": round(read_s, 6),
            "fold_s": round(fold_s, 6),
            "at": time.time(),
        }
        assert self.options.stage_times is not None
        with open(self.options.stage_times, "a") as times:
            times.write(json.dumps(line) + "\n")
        return iter(out)
