"""Two failures of the analytics jobs' live path, found by ``bench/analytics.py``:

- a range read stalled ("no record for 30s") on a partition a steady producer writes in many
  small batches: Tansu's fetch lists the partition's stored batches only for as long as the
  fetch may wait, so a short ``fetch.wait.max.ms`` brought nothing, below the high watermark,
  forever. The reader now opens the consumer again with a longer wait; the planner's end probe
  needs only a fetch response's high watermark, not a record.
- a job stopped while its batch ran died of a ``StackOverflowError`` in Java's regex: Spark
  matches the text of a foreachBatch error with a pattern that recurses once per character,
  and the Java stack trace of a ``Py4JJavaError`` is long. Batch errors now leave in brief.

The broker-side condition is made at once here by a fetch wait too short for any listing.
"""

import re
import time
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from connectors.kafka import TopicAdmin, TopicSpec, fetching
from spark_streaming import kafka_reader
from spark_streaming.errors import StreamingError
from spark_streaming.kafka_offsets import OffsetRange
from spark_streaming.kafka_options import KafkaSourceOptions
from spark_streaming.kafka_reader import read_range, source_consumer, watermarks
from spark_streaming.view_job import batch_errors_in_brief
from tests.integration.conftest import Endpoints

RECORDS = 1000


@pytest.fixture
def topic(s3_stack: Endpoints, unique: str) -> Iterator[str]:
    name = f"live_{unique}"
    TopicAdmin(s3_stack.kafka).ensure(TopicSpec(name, partitions=1))
    # One record per stored batch, as a steady producer with a short linger leaves them.
    producer = Producer(
        s3_stack.kafka.client_properties(**{"linger.ms": 0, "batch.num.messages": 1})
    )
    for i in range(RECORDS):
        producer.produce(name, value=f"v{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    yield name
    TopicAdmin(s3_stack.kafka).delete(name)


def options_for(stack: Endpoints, topic: str, poll_timeout_ms: int) -> KafkaSourceOptions:
    return KafkaSourceOptions.parse(
        {
            **stack.spark_kafka_options,
            "subscribe": topic,
            "kafkaConsumer.pollTimeoutMs": str(poll_timeout_ms),
        }
    )


def set_waits(monkeypatch: pytest.MonkeyPatch, waits: tuple[int, ...]) -> None:
    """The fetch waits a range read tries, in turn."""
    monkeypatch.setattr(kafka_reader, "FETCH_WAITS_MS", waits)
    monkeypatch.setattr(fetching, "FETCH_WAITS_MS", waits)


def offsets_read(options: KafkaSourceOptions, r: OffsetRange) -> list[int]:
    return [o for batch in read_range(options, r) for o in batch.column("offset").to_pylist()]


def test_a_range_read_waits_longer_when_fetches_bring_nothing_and_reads_it_exactly(
    s3_stack: Endpoints, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = options_for(s3_stack, topic, 20_000)
    monkeypatch.setattr(kafka_reader, "_learned_wait", {})
    set_waits(monkeypatch, (1, 500))
    if s3_stack.local is not None:
        # On Tansu a 1 ms fetch wait lists none of the stored batches: with it alone, the read
        # stalls (as 10 ms did on a partition of thousands of batches).
        set_waits(monkeypatch, (1,))
        with pytest.raises(StreamingError, match="no record for 3s at offset 100"):
            offsets_read(options_for(s3_stack, topic, 3_000), OffsetRange(topic, 0, 100, 300))
        set_waits(monkeypatch, (1, 500))
    for start, end in ((100, 300), (0, RECORDS), (RECORDS - 1, RECORDS)):
        assert offsets_read(options, OffsetRange(topic, 0, start, end)) == list(range(start, end))
    # The wait that brought records is kept for the partition: the next range starts with it.
    learned = kafka_reader._learned_wait[(s3_stack.bootstrap_servers, topic, 0)]
    assert learned == (1 if s3_stack.local is None else 500)


def test_the_true_end_needs_no_record_only_a_fetch_response(
    s3_stack: Endpoints, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fetch that brings no record (the wait too short for Tansu's listing) still carries the
    # high watermark: the end probe ends with the first response instead of its timeout.
    monkeypatch.setattr(kafka_reader, "PROBE_FETCH_WAIT_MS", 1)
    options = options_for(s3_stack, topic, 30_000)
    consumer = source_consumer(options)
    began = time.monotonic()
    try:
        lows, highs = watermarks(consumer, [(topic, 0)], 30.0, options)
    finally:
        consumer.close()
    assert (lows[(topic, 0)], highs[(topic, 0)]) == (0, RECORDS)
    assert time.monotonic() - began < 10


def long_jvm_error(batch: Any, batch_id: int) -> None:
    """A Java error pyspark does not translate (it stays a ``Py4JJavaError``), its text long,
    as a cancelled Spark job's is when ``query.stop()`` interrupts a running batch."""
    batch.sparkSession._jvm.java.lang.Class.forName("no.such." + "x" * 50_000)


def spark_sees_a_stop(spark: Any, error: BaseException) -> bool:
    """What Spark does with a foreachBatch error once the query is stopping: its own regex
    (``StreamExecution.PROXY_ERROR``) over the Python traceback's text."""
    regex = spark._jvm.org.apache.spark.sql.execution.streaming.runtime.StreamExecution
    text = "".join(traceback.format_exception(error))
    return bool(regex.PROXY_ERROR().findFirstIn(text).isDefined())


def test_a_long_jvm_error_in_a_batch_stays_short_for_sparks_regex(spark: Any) -> None:
    batch = spark.range(1)
    with pytest.raises(Exception, match="ClassNotFoundException") as bare:
        long_jvm_error(batch, 3)
    # As Spark has it: the regex recurses once per character of the Java trace and overflows
    # (in the stream thread: the query dies of it, the real error lost).
    with pytest.raises(Exception, match="StackOverflowError"):
        spark_sees_a_stop(spark, bare.value)
    with pytest.raises(StreamingError) as brief:
        batch_errors_in_brief(long_jvm_error, "job")(batch, 3)
    cause = r"job: batch 3 failed: java\.lang\.ClassNotFoundException: no\.such\.x"
    assert re.search(cause, str(brief.value))
    assert spark_sees_a_stop(spark, brief.value) is False
