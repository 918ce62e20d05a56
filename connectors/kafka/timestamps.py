"""When records were written: the timestamp of the record at (or first after) given offsets.

What a lag in seconds is measured with: the record a consumer has still to read, and how long
ago it was produced. One assigned consumer reads one record per partition (a fetch's worth);
a partition that brings nothing in time is left out of the answer rather than guessed.
"""

import time
from collections.abc import Mapping

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from connectors.errors import KafkaError
from connectors.kafka.config import ClientValue, KafkaConfig
from connectors.kafka.fetching import FETCH_WAITS_MS, range_fetch

__all__ = ["record_times"]

Ref = tuple[str, int]


def record_times(
    kafka: KafkaConfig, offsets: Mapping[Ref, int], timeout: float = 5.0
) -> dict[Ref, float]:
    """Per (topic, partition), the Unix time (seconds) of the first record at or after its
    offset; partitions with no record there (at the end, or nothing fetched within
    ``timeout``) are left out."""
    if not offsets:
        return {}
    props: dict[str, ClientValue] = {
        "group.id": f"{kafka.client_id}-timestamps",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        **range_fetch(FETCH_WAITS_MS[0], 1),
    }
    consumer = Consumer(kafka.client_properties(**props))
    out: dict[Ref, float] = {}
    pending = set(offsets)
    try:
        consumer.assign([TopicPartition(t, p, o) for (t, p), o in offsets.items()])
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(len(pending), timeout=0.2):
                ref = (msg.topic() or "", msg.partition() or 0)
                err = msg.error()
                if err is not None:
                    if err.code() == RdKafkaError._PARTITION_EOF:
                        pending.discard(ref)  # nothing at or after the offset
                        continue
                    raise KafkaError(f"reading {ref[0]}[{ref[1]}]: {err.str()}", err.name())
                if ref not in pending:
                    continue
                pending.discard(ref)
                kind, stamp = msg.timestamp()
                if kind != TIMESTAMP_NOT_AVAILABLE and stamp >= 0:
                    out[ref] = stamp / 1000.0
                consumer.pause([TopicPartition(ref[0], ref[1])])
    finally:
        consumer.close()
    return out
