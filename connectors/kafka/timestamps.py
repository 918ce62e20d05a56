"""When records were written: the timestamp of the record at (or first after) given offsets.

What a lag in seconds is measured with: the record a consumer has still to read, and how long
ago it was produced. One assigned consumer reads one record per partition (a fetch's worth);
when fetches bring nothing for a while it is opened again with a longer fetch wait (on Tansu a
short wait lists only a partition's first batches: ``connectors.kafka.fetching``); a partition
that brings nothing in time is left out of the answer rather than guessed.
"""

import time
from collections.abc import Mapping

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from connectors.errors import KafkaError
from connectors.kafka.config import ClientValue, KafkaConfig
from connectors.kafka.fetching import FETCH_WAITS_MS, range_fetch, stall_s

__all__ = ["record_times"]

Ref = tuple[str, int]


def record_times(
    kafka: KafkaConfig, offsets: Mapping[Ref, int], timeout: float = 5.0
) -> dict[Ref, float]:
    """Per (topic, partition), the Unix time (seconds) of the first record at or after its
    offset; partitions with no record there (at the end, or nothing fetched within
    ``timeout``) are left out."""
    out: dict[Ref, float] = {}
    pending = dict(offsets)
    deadline = time.monotonic() + timeout
    for wait in FETCH_WAITS_MS:
        if not pending or time.monotonic() >= deadline:
            break
        until = deadline if wait == FETCH_WAITS_MS[-1] else time.monotonic() + stall_s(wait)
        _read_times(kafka, pending, wait, min(until, deadline), out)
    return out


def _read_times(
    kafka: KafkaConfig, pending: dict[Ref, int], wait_ms: int, until: float, out: dict[Ref, float]
) -> None:
    """Read the first record at ``pending``'s offsets with this fetch wait until ``until``;
    each partition answered (a record, or its end) leaves ``pending``."""
    props: dict[str, ClientValue] = {
        "group.id": f"{kafka.client_id}-timestamps",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        **range_fetch(wait_ms, 1),
    }
    consumer = Consumer(kafka.client_properties(**props))
    try:
        consumer.assign([TopicPartition(t, p, o) for (t, p), o in pending.items()])
        while pending and time.monotonic() < until:
            for msg in consumer.consume(len(pending), timeout=0.2):
                ref = (msg.topic() or "", msg.partition() or 0)
                err = msg.error()
                if err is not None:
                    if err.code() == RdKafkaError._PARTITION_EOF:
                        pending.pop(ref, None)  # nothing at or after the offset
                        continue
                    raise KafkaError(f"reading {ref[0]}[{ref[1]}]: {err.str()}", err.name())
                if ref not in pending:
                    continue
                del pending[ref]
                kind, stamp = msg.timestamp()
                if kind != TIMESTAMP_NOT_AVAILABLE and stamp >= 0:
                    out[ref] = stamp / 1000.0
                consumer.pause([TopicPartition(ref[0], ref[1])])
    finally:
        consumer.close()
