"""The Kafka store and the end probe on a partition of many small batches (one record per
produce request, as a writer committing one small batch at a time leaves them).

On Tansu a fetch lists the partition's stored batches only while ``fetch.wait.max.ms`` lasts:
with the short wait the store starts with, a fetch deep in such a partition comes back empty
below the high watermark, forever. The store's reads must go on with a longer wait, and the end
probe must take the high watermark from a fetch response without waiting for a record.
"""

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from connectors.kafka import TopicAdmin, history_topic, state_topic
from connectors.kafka.offsets import probe_consumer, true_watermarks
from connectors.stores import kafka_ledger
from connectors.stores.kafka import KafkaStore
from connectors.stores.kafka_ledger import GenerationRecord, Slot, ledger_key
from tests.integration.conftest import Endpoints
from tributary.view_store import Collection

SINGLE = 200  # single-record batches
TAIL = 5  # then one batch of this many records: ListOffsets (on Tansu) says its base + 1


@dataclass(frozen=True)
class SmallBatches:
    view: str
    topic: str
    ledger: str
    producer: Producer


def _record(producer: Producer, topic: str, i: int) -> None:
    slot = Slot(json.dumps({"n": i}).encode(), position=i + 1, applied=1)
    producer.produce(
        topic, key=f"k{i:03d}".encode(), value=slot.value, headers=slot.headers("g1", i)
    )


def tail_batch(producer: Producer, topic: str, first: int) -> None:
    """``TAIL`` records in one produce request."""
    for i in range(first, first + TAIL):
        _record(producer, topic, i)
    assert producer.flush(30) == 0


@pytest.fixture(scope="module")
def small_batches(s3_stack: Endpoints) -> Iterator[SmallBatches]:
    unique = uuid.uuid4().hex[:10]
    view, topic, ledger = f"small{unique}", f"small-batches-{unique}", f"ledger-{unique}"
    admin = TopicAdmin(s3_stack.kafka)
    admin.ensure(history_topic(topic, 1))
    admin.ensure(state_topic(ledger, 1))
    single = Producer(s3_stack.kafka.client_properties(**{"linger.ms": 0}))
    for i in range(SINGLE):
        _record(single, topic, i)
        assert single.flush(30) == 0  # each record its own batch
    batched = Producer(s3_stack.kafka.client_properties(**{"linger.ms": 200}))
    tail_batch(batched, topic, SINGLE)
    # The live generation's ledger record: every record of the topic is committed.
    record = GenerationRecord("g1", 0, bounds={topic: {0: SINGLE + TAIL}})
    single.produce(ledger, key=ledger_key(view, None).encode(), value=record.to_json())
    assert single.flush(30) == 0
    yield SmallBatches(view, topic, ledger, batched)
    admin.delete(topic, ledger)


def test_the_kafka_store_reads_a_partition_of_many_small_batches(
    s3_stack: Endpoints, small_batches: SmallBatches, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 1 ms first wait stalls this partition on Tansu for certain (10 ms does from a depth that
    # depends on the machine: a few hundred batches up to thousands).
    monkeypatch.setattr(kafka_ledger, "FIRST_FETCH_WAIT_MS", 1)
    s = small_batches
    store = KafkaStore(
        s3_stack.kafka,
        s.view,
        [Collection("items")],
        topics={"items": s.topic},
        ledger_topic=s.ledger,
    )
    try:
        began = time.monotonic()
        entries = store.scan("items")
        assert [e.key for e in entries] == [f"k{i:03d}" for i in range(SINGLE + TAIL)]
        assert [e.fields for e in entries] == [{"n": i} for i in range(SINGLE + TAIL)]
        last = store.get("items", f"k{SINGLE + TAIL - 1:03d}")
        assert last is not None and last.position == SINGLE + TAIL
        assert time.monotonic() - began < 15  # a stalled read fails after 30 s
        if s3_stack.local is not None:  # on Tansu the reads stalled and went on with a longer wait
            assert store.reader().wait > 1
    finally:
        store.close()


def test_the_end_probe_needs_a_fetch_response_not_a_record(
    s3_stack: Endpoints, small_batches: SmallBatches
) -> None:
    s = small_batches
    ref = (s.topic, 0)

    def fresh() -> Consumer:  # a 1 ms wait: on Tansu its fetch lists no batch, brings no record
        return probe_consumer(s3_stack.kafka, **{"fetch.wait.max.ms": 1})

    listing = probe_consumer(s3_stack.kafka)
    try:
        listed = listing.get_watermark_offsets(TopicPartition(*ref), timeout=10)
        if s3_stack.local is not None:  # Tansu's ListOffsets under-reports the end
            assert listed[1] < SINGLE + TAIL
        began = time.monotonic()
        marks = true_watermarks(listing, [ref], fresh=fresh)
        assert marks[ref] == (0, SINGLE + TAIL)
        # The end comes from the response, not after the probe's 10 s timeout.
        assert time.monotonic() - began < 5
        # Again after a batch more: the end is this call's, never an older response's.
        tail_batch(s.producer, s.topic, SINGLE + TAIL)
        marks = true_watermarks(listing, [ref], fresh=fresh)
        assert marks[ref] == (0, SINGLE + 2 * TAIL)
    finally:
        listing.close()
