"""Read a topic whole, from its start to its true end (assigned partitions, no group).

A partition's offsets are not one record each: compaction removes records, and transaction
markers take an offset of their own. So a partition is read until the consumer's position
reaches the true end (or the end-of-partition signal says there is nothing more below it),
never by counting records.

:func:`read_tail` reads only what a partition gained since offsets read before (what `verify`
checked last time); it refuses a partition whose end went below them.
"""

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, Message, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from connectors.errors import KafkaError, TopicRewoundError
from connectors.kafka.admin import TopicAdmin
from connectors.kafka.config import ClientValue, KafkaConfig
from connectors.kafka.fetching import FETCH_WAITS_MS, longer_wait, range_fetch, stall_s
from connectors.kafka.offsets import probe_consumer, true_watermarks


@dataclass(frozen=True)
class Record:
    """A record as read: where it is, its key, value and headers."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes | None]
    timestamp_ms: int | None = None  # the record's timestamp (None: the broker gave none)


@dataclass(frozen=True)
class Tail:
    """Records read from given offsets to the end: ``ends`` is, per partition, the offset the
    read reached (the next read starts there)."""

    records: list[Record]
    ends: dict[int, int]


def read_topic(kafka: KafkaConfig, topic: str, timeout: float = 60.0) -> list[Record]:
    """Every record of the topic now, partition by partition in offset order. ``timeout`` is
    how long a partition may go without bringing a record before the read fails."""
    return read_tail(kafka, topic, {}, timeout).records


def read_tail(
    kafka: KafkaConfig,
    topic: str,
    since: Mapping[int, int],
    timeout: float = 60.0,
    only: Collection[int] | None = None,
) -> Tail:
    """The records of each partition from ``since[partition]`` (its log start when absent or
    below it: records removed by retention or compaction were read before) to its true end now
    (``only``: of these partitions only).

    Raises :class:`TopicRewoundError` when a partition now ends below ``since`` (the topic was
    deleted and created again, or its log was truncated): what was read before no longer
    describes it.
    """
    partitions = TopicAdmin(kafka).partition_count(topic) or 0
    chosen = [p for p in range(partitions) if only is None or p in only]
    probe = probe_consumer(kafka)
    try:
        marks = true_watermarks(
            probe, [(topic, p) for p in chosen], fresh=lambda: probe_consumer(kafka)
        )
    finally:
        probe.close()
    behind = {
        p: (since[p], marks[(topic, p)][1])
        for p in chosen
        if since.get(p, 0) > marks[(topic, p)][1]
    }
    gone = sorted(set(since) - set(range(partitions)))
    if behind or gone:
        raise TopicRewoundError(
            f"{topic}: "
            + "; ".join(
                [
                    f"partition {p} ends at {end}, below offset {was} read before"
                    for p, (was, end) in behind.items()
                ]
                + [f"partition {p} is gone" for p in gone]
            )
        )
    out: list[Record] = []
    ends: dict[int, int] = {}
    for p in chosen:
        low, high = marks[(topic, p)]
        start = max(low, since.get(p, 0))
        if high > start:
            out.extend(_read_partition(kafka, topic, p, start, high, timeout))
        ends[p] = high
    return Tail(out, ends)


def read_range(
    kafka: KafkaConfig, topic: str, partition: int, low: int, high: int, timeout: float = 60.0
) -> list[Record]:
    """The records of one partition from offset ``low`` until the position reaches ``high``
    (at most the partition's true end)."""
    return _read_partition(kafka, topic, partition, low, high, timeout) if high > low else []


def read_at(
    kafka: KafkaConfig, refs: list[tuple[str, int, int]], timeout: float = 10.0
) -> dict[tuple[str, int, int], Record]:
    """The records at given (topic, partition, offset); a record that is no longer there
    (retention, compaction) or not fetched within ``timeout`` is left out."""
    out: dict[tuple[str, int, int], Record] = {}
    if not refs:
        return out
    consumer = _consumer(kafka, FETCH_WAITS_MS[0], 1)
    try:
        for topic, partition, offset in refs:
            consumer.assign([TopicPartition(topic, partition, offset)])
            deadline = time.monotonic() + timeout
            found: list[Record] = []
            while not found and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == RdKafkaError._PARTITION_EOF:
                        break
                    raise KafkaError(f"reading {topic}[{partition}]: {err.str()}", err.name())
                if (msg.offset() or 0) > offset:
                    break  # the record at the offset is gone
                _take(msg, topic, partition, offset, offset + 1, found)
            if found:
                out[(topic, partition, offset)] = found[0]
    finally:
        consumer.close()
    return out


def _consumer(kafka: KafkaConfig, wait_ms: int, records: int) -> Consumer:
    props: dict[str, ClientValue] = {
        "group.id": "tributary-reader",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        **range_fetch(wait_ms, records),
    }
    return Consumer(kafka.client_properties(**props))


def _read_partition(
    kafka: KafkaConfig, topic: str, partition: int, low: int, high: int, timeout: float
) -> list[Record]:
    """Records from ``low`` until the position reaches ``high``; when fetches bring nothing for
    a while the consumer is opened again with a longer fetch wait (see ``fetching``)."""
    out: list[Record] = []
    position = low
    wait = FETCH_WAITS_MS[0]
    deadline = time.monotonic() + timeout
    while position < high:
        consumer = _consumer(kafka, wait, high - position)
        try:
            consumer.assign([TopicPartition(topic, partition, position)])
            quiet_until = time.monotonic() + stall_s(wait)
            while position < high:
                # Ask for no more than what may still be there: consume() waits out its
                # timeout when fewer messages remain.
                messages = consumer.consume(min(high - position, 10_000), timeout=0.5)
                now = time.monotonic()
                if messages:
                    quiet_until, deadline = now + stall_s(wait), now + timeout
                elif now > deadline:
                    raise KafkaError(
                        f"{topic}[{partition}]: no record for {timeout:.0f}s at offset"
                        f" {position} of {high}"
                    )
                elif now > quiet_until:
                    break
                for msg in messages:
                    position = _take(msg, topic, partition, position, high, out)
                    if position >= high:
                        break
        finally:
            consumer.close()
        wait = longer_wait(wait)
    return out


def _take(
    msg: Message, topic: str, partition: int, position: int, high: int, out: list[Record]
) -> int:
    """Add one consumed message to ``out``; the position after it."""
    err = msg.error()
    if err is not None:
        if err.code() == RdKafkaError._PARTITION_EOF:
            # At the log's end: offsets still below it hold no record (compacted away,
            # transaction markers).
            return high if (msg.offset() or 0) >= high else position
        raise KafkaError(f"reading {topic}[{partition}]: {err.str()}", err.name())
    offset = msg.offset() or 0
    if offset >= high:
        return high
    kind, stamp = msg.timestamp()
    out.append(
        Record(
            topic,
            partition,
            offset,
            msg.key(),
            msg.value(),
            _headers(msg.headers()),
            stamp if kind != TIMESTAMP_NOT_AVAILABLE and stamp >= 0 else None,
        )
    )
    return offset + 1


def _headers(
    raw: dict[str, str | bytes | None] | list[tuple[str, str | bytes | None]] | None,
) -> dict[str, bytes | None]:
    items = list(raw.items()) if isinstance(raw, dict) else (raw or [])
    return {k: (v.encode() if isinstance(v, str) else v) for k, v in items}
