"""True partition end offsets.

``ListOffsets(latest)`` is what ``get_watermark_offsets`` asks, and some Kafka-protocol
brokers (Tansu among them) answer it with the base offset of the last stored batch + 1
instead of the end of the log. The high watermark carried by a *fetch* response is right
everywhere, so a reader that needs the true end fetches from the reported end minus one and
keeps the larger of the two values. Only the response's high watermark is needed, not a record:
on Tansu a fetch with a short wait can come back empty below the end of a partition of many
small batches (see ``connectors.kafka.fetching``), and it still carries the high watermark. On
Apache Kafka both values agree and this costs one small fetch per non-empty partition.
"""

import logging
import time
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from connectors.errors import KafkaError
from connectors.kafka.config import ClientValue, KafkaConfig
from connectors.kafka.fetching import SHORT_WAIT_MS

log = logging.getLogger(__name__)

Watermarks = dict[tuple[str, int], tuple[int, int]]

_GONE = (RdKafkaError.OFFSET_OUT_OF_RANGE, RdKafkaError._AUTO_OFFSET_RESET)


def probe_consumer(config: KafkaConfig, **overrides: ClientValue) -> Consumer:
    """A group-less consumer for assigned reads (no JoinGroup, no commits) and end probes."""
    props: dict[str, ClientValue] = {
        "group.id": f"{config.client_id}-probe",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": SHORT_WAIT_MS,  # Tansu holds a fetch this long even when data is there
        **overrides,
    }
    return Consumer(config.client_properties(**props))


def true_watermarks(
    consumer: Consumer,
    partitions: Iterable[tuple[str, int]],
    timeout: float = 10.0,
    *,
    fresh: Callable[[], Consumer],
    known: "TrueEnds | None" = None,
) -> Watermarks:
    """(low, high) per partition with the high watermark taken from a fetch response.

    ``consumer`` lists the offsets; ``fresh`` makes the consumer that fetches from the listed
    end minus one (with a short wait, as :func:`probe_consumer`: on Tansu a fetch is held that
    long), closed after the call. It must be a new one: a client keeps the last high watermark
    it saw per partition, and only a new client's can come from this call's fetch (Tansu's
    ListOffsets under-reports by more than the last batch, so an older value cannot be told
    from a current one). After ``timeout`` a partition keeps its listed end (a warning is
    logged). ``known`` remembers ends across calls: a partition whose listed end has not moved
    since it was probed keeps the end that probe found, and is not probed again.
    """
    marks: Watermarks = {}
    for topic, partition in partitions:
        try:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout
            )
        except Exception as exc:  # confluent_kafka.KafkaException
            raise KafkaError(f"cannot list offsets of {topic}[{partition}]: {exc}") from exc
        marks[(topic, partition)] = (int(low), int(high))
    listed = {ref: high for ref, (_, high) in marks.items()}
    if known is not None:
        marks = {ref: (low, known.recall(ref, high)) for ref, (low, high) in marks.items()}
    pending = {
        ref
        for ref, (low, high) in marks.items()
        if high > low and (known is None or not known.knows(ref, listed[ref]))
    }
    if not pending:
        return marks
    probe = fresh()
    try:
        probe.assign([TopicPartition(t, p, marks[(t, p)][1] - 1) for t, p in sorted(pending)])
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            # The fetches run in the background; their records are not needed.
            for msg in probe.consume(len(pending), timeout=0.05):
                err = msg.error()
                if err is None or err.code() == RdKafkaError._PARTITION_EOF:
                    continue
                if err.code() in _GONE:  # deleted since it was listed: keep the listed end
                    pending.discard((msg.topic() or "", msg.partition() or 0))
                    continue
                raise KafkaError(f"fetch for end offsets failed: {err.str()}", err.name())
            for ref in sorted(pending):
                low, high = marks[ref]
                _, fetched = probe.get_watermark_offsets(TopicPartition(*ref), cached=True)
                if fetched is not None and fetched >= 0:
                    marks[ref] = (low, max(high, int(fetched)))
                    pending.discard(ref)
    finally:
        probe.close()
    if pending:
        log.warning(
            "no fetch response within %.0fs for %s: keeping the listed end offsets",
            timeout,
            ", ".join(f"{t}[{p}]" for t, p in sorted(pending)),
        )
    if known is not None:
        for ref, (_, high) in marks.items():
            if ref not in pending:
                known.learn(ref, listed[ref], high)
    return marks


class TrueEnds:
    """True ends remembered between calls of :func:`true_watermarks` by a reader that asks
    again and again (a streaming source's planner): appending records moves a partition's
    listed end (on Tansu the base of a stored batch + 1, on Apache Kafka the end itself), so
    while the listed end stays where it was when a fetch found the true end, that end holds and
    no probe is needed. Polling an idle topic then costs one ListOffsets per partition, not a
    new client and a fetch. A remembered end is trusted for ``ttl_s`` only: Tansu's listed end
    can also stay put while batches are appended (its listing of a partition's batches is cut
    short like a fetch's), and a planner that trusted it for good stopped below the true end
    until the next record came (seen: a view 127 records short for minutes)."""

    def __init__(self, ttl_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._ends: dict[tuple[str, int], tuple[int, int, float]] = {}  # listed, true, when

    def knows(self, ref: tuple[str, int], listed: int) -> bool:
        seen = self._ends.get(ref)
        return seen is not None and seen[0] == listed and self._clock() - seen[2] < self.ttl_s

    def recall(self, ref: tuple[str, int], listed: int) -> int:
        """The true end for this listed end, if known (else the listed end)."""
        seen = self._ends.get(ref)
        return seen[1] if seen is not None and seen[0] == listed else listed

    def learn(self, ref: tuple[str, int], listed: int, true: int) -> None:
        self._ends[ref] = (listed, max(listed, true), self._clock())
