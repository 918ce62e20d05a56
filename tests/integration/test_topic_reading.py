"""The whole-topic reader reads to the true end of a partition whose offsets are not one record
each: transaction markers take offsets of their own (mid-log and as the last offset), which is
the same gap a compacted topic has where records were removed (the local broker does not
compact, so markers are how this test makes gaps)."""

import time
import uuid

import pytest
from confluent_kafka import Producer

from connectors.errors import TopicRewoundError
from connectors.kafka import TopicAdmin, state_topic
from connectors.kafka.producing import idempotent_producer
from connectors.kafka.reading import read_tail, read_topic
from tests.integration.conftest import Endpoints
from tests.integration.kafka_reading import wait_until


def test_a_partition_with_transaction_markers_is_read_whole(
    s3_stack: Endpoints, unique: str
) -> None:
    topic = f"gaps-{unique}"
    TopicAdmin(s3_stack.kafka).ensure(state_topic(topic, 1))
    plain = idempotent_producer(s3_stack.kafka)
    for i in range(5):
        plain.produce(topic, key=f"k{i}".encode(), value=b"plain")
    assert plain.flush(30) == 0
    txn = Producer(
        s3_stack.kafka.client_properties(**{"transactional.id": f"reader-{uuid.uuid4().hex}"})
    )
    txn.init_transactions(30)
    for value in (b"committed-1", b"committed-2"):
        txn.begin_transaction()
        for i in range(3):
            txn.produce(topic, key=f"t{i}".encode(), value=value)
        txn.commit_transaction(30)  # a marker after these three records; the last one ends the log
    ends = TopicAdmin(s3_stack.kafka).end_offsets(topic)
    assert ends == {0: 5 + 3 + 1 + 3 + 1}  # records and two commit markers

    started = time.monotonic()
    records = read_topic(s3_stack.kafka, topic, timeout=30)
    assert time.monotonic() - started < 10  # no wait for records that will never come
    assert [r.offset for r in records] == [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11]
    assert [r.value for r in records][-3:] == [b"committed-2"] * 3


def test_a_partition_of_many_small_batches_is_read_whole(s3_stack: Endpoints, unique: str) -> None:
    """One record per produce request, as CDC publishes a trickle of commands: on Tansu a fetch
    with a short wait lists only the first few batches and, further on, comes back empty below
    the high watermark; a reader that keeps that wait never reaches the end."""
    topic = f"small-batches-{unique}"
    TopicAdmin(s3_stack.kafka).ensure(state_topic(topic, 1))
    producer = Producer(s3_stack.kafka.client_properties(**{"linger.ms": 0}))
    for i in range(300):
        producer.produce(topic, key=f"k{i}".encode(), value=b"v" * 200)
        assert producer.flush(30) == 0  # each record its own batch
    records = read_topic(s3_stack.kafka, topic, timeout=30)
    assert [r.offset for r in records] == list(range(300))
    assert [r.key for r in records] == [f"k{i}".encode() for i in range(300)]


def test_a_tail_read_starts_where_the_last_read_ended(s3_stack: Endpoints, unique: str) -> None:
    """What `verify` relies on to read only what a topic gained: per partition, the offsets a
    read reached; a topic created again below them is refused, never read as if unchanged."""
    topic = f"tail-{unique}"
    admin = TopicAdmin(s3_stack.kafka)
    admin.ensure(state_topic(topic, 2))
    producer = Producer(s3_stack.kafka.client_properties(**{"partitioner": "murmur2_random"}))

    def produce(values: range) -> None:
        for i in values:
            producer.produce(topic, key=f"k{i}".encode(), value=str(i).encode())
        assert producer.flush(30) == 0

    produce(range(8))
    first = read_tail(s3_stack.kafka, topic, {}, timeout=30)
    assert sorted(int(r.value or b"") for r in first.records) == list(range(8))
    assert first.ends == admin.end_offsets(topic) and sum(first.ends.values()) == 8

    produce(range(8, 13))
    second = read_tail(s3_stack.kafka, topic, first.ends, timeout=30)
    assert sorted(int(r.value or b"") for r in second.records) == list(range(8, 13))
    assert sum(second.ends.values()) == 13
    assert read_tail(s3_stack.kafka, topic, second.ends, timeout=30).records == []

    admin.delete(topic)
    wait_until(lambda: topic not in admin.topic_names(), 30, "the topic deletion")
    admin.ensure(state_topic(topic, 2))
    produce(range(2))
    with pytest.raises(TopicRewoundError, match="below offset"):
        read_tail(s3_stack.kafka, topic, second.ends, timeout=30)
    assert len(read_tail(s3_stack.kafka, topic, {}, timeout=30).records) == 2
