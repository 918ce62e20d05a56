"""The Kafka store's ledger and record formats, and the reads and produces of its topics.

What :class:`~connectors.stores.kafka.KafkaStore` and its writer
(:mod:`connectors.stores.kafka_writer`) share: the output records' headers and what a record
says (:class:`Slot`), a generation's ledger record (:class:`GenerationRecord`: bounds and holes
per output partition) and its key, the offset-range arithmetic of bounds and holes, range reads
of the output and ledger topics (:class:`RangeReader`, :func:`iter_ranges`,
:func:`read_offsets`), a batch's produces and their acknowledgements (:class:`Deliveries`), and
the ledger topic as one view folds it (:class:`LedgerLog`). The topics' layout and the commit
protocol are described in :mod:`connectors.stores.kafka`.
"""

import bisect
import functools
import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from connectors.errors import KafkaError, StoreError, StoreUnavailableError
from connectors.kafka.config import ClientValue, KafkaConfig
from connectors.kafka.fetching import SHORT_WAIT_MS, longer_wait, range_fetch, stall_s
from connectors.kafka.offsets import true_watermarks
from tributary.view_model import Commit, Offsets

log = logging.getLogger(__name__)

POSITION_HEADER = "tributary.position"
APPLIED_HEADER = "tributary.applied"
GENERATION_HEADER = "tributary.generation"
BATCH_HEADER = "tributary.batch"

LIVE = "live"  # the ledger name of the live generation's record
SEP = "\x1f"  # between the view and the generation in a ledger key

MAX_MESSAGE_BYTES = 1_000_000  # the producer's message.max.bytes (librdkafka's default)
RECORD_OVERHEAD = 512  # headers and framing, kept free below MAX_MESSAGE_BYTES

FIRST_FETCH_WAIT_MS = SHORT_WAIT_MS  # reads start with it (Tansu holds every fetch that long)

Ident = tuple[str, str]  # (collection, key)
PartitionRef = tuple[str, int]  # (topic, partition)
Range = tuple[int, int]  # [start, end) offsets
Bounds = dict[str, dict[int, int]]  # topic -> partition -> offset after the last committed record
Holes = dict[str, dict[int, list[Range]]]  # topic -> partition -> ranges without committed data


# -- ledger records and offset ranges ---------------------------------------------------


def ledger_key(view: str, generation: str | None) -> str:
    """The ledger key of a view's live record (``generation`` None) or of a shadow's."""
    return f"{view}{SEP}{LIVE if generation is None else generation}"


def merge_ranges(ranges: Iterable[Range]) -> list[Range]:
    """Ranges sorted, with overlapping and touching ones joined (empty ones dropped)."""
    out: list[Range] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def gaps_between(start: int, offsets: Iterable[int]) -> tuple[int, list[Range]]:
    """The end after ``offsets`` (the last + 1) and the ranges from ``start`` on they miss."""
    holes: list[Range] = []
    cursor = start
    for offset in sorted(set(offsets)):
        if offset < start:
            raise ValueError(f"offset {offset} is below the bound {start}")
        if offset > cursor:
            holes.append((cursor, offset))
        cursor = offset + 1
    return cursor, holes


def in_ranges(ranges: Sequence[Range], offset: int) -> bool:
    """Whether ``offset`` lies in one of the sorted, disjoint ``ranges``."""
    i = bisect.bisect_right(ranges, (offset, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= offset < ranges[i][1]


def hole_size(holes: Holes) -> int:
    """How many offsets the holes span."""
    return sum(
        end - start for parts in holes.values() for rs in parts.values() for start, end in rs
    )


@dataclass(frozen=True)
class GenerationRecord:
    """A generation's ledger record: its last batch, the offsets it reached, and which offsets
    of its output topics hold its committed data."""

    generation: str
    batch_id: int = -1
    offsets: Offsets = field(default_factory=dict)
    batches: int = 0
    bounds: Bounds = field(default_factory=dict)
    holes: Holes = field(default_factory=dict)

    def to_json(self) -> bytes:
        doc = {
            "generation": self.generation,
            "batch_id": self.batch_id,
            "offsets": self.offsets,
            "batches": self.batches,
            "bounds": {
                t: {str(p): e for p, e in sorted(b.items())} for t, b in self.bounds.items()
            },
            "holes": {
                t: {str(p): [list(r) for r in rs] for p, rs in sorted(h.items()) if rs}
                for t, h in self.holes.items()
            },
        }
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "GenerationRecord":
        doc = json.loads(data)
        if not isinstance(doc, dict) or not isinstance(doc.get("generation"), str):
            raise ValueError(f"not a generation record: {data[:120]!r}")
        return cls(
            generation=doc["generation"],
            batch_id=int(doc.get("batch_id", -1)),
            offsets={
                str(t): {str(p): int(o) for p, o in parts.items()}
                for t, parts in (doc.get("offsets") or {}).items()
            },
            batches=int(doc.get("batches", 0)),
            bounds={
                str(t): {int(p): int(e) for p, e in parts.items()}
                for t, parts in (doc.get("bounds") or {}).items()
            },
            holes={
                str(t): {
                    int(p): merge_ranges((int(a), int(b)) for a, b in rs) for p, rs in h.items()
                }
                for t, h in (doc.get("holes") or {}).items()
            },
        )

    def commit(self, view: str) -> Commit:
        return Commit(view, self.generation, self.batch_id, self.offsets, self.batches)

    def bound(self, topic: str, partition: int) -> int:
        return self.bounds.get(topic, {}).get(partition, 0)

    def holes_of(self, topic: str, partition: int) -> list[Range]:
        return self.holes.get(topic, {}).get(partition, [])

    def advanced(self, delivered: Mapping[PartitionRef, Iterable[int]]) -> tuple[Bounds, Holes]:
        """Bounds and holes after records were delivered at these offsets: each written
        partition's bound moves past its last record, and the offsets in between that are not
        these records (someone else's, never committed) become holes. Raises ValueError when
        a record lies below its partition's bound (the topic was recreated)."""
        bounds = {t: dict(b) for t, b in self.bounds.items()}
        holes = {t: {p: list(rs) for p, rs in h.items()} for t, h in self.holes.items()}
        for (topic, partition), offsets in delivered.items():
            start = self.bound(topic, partition)
            try:
                end, missed = gaps_between(start, offsets)
            except ValueError as exc:
                raise ValueError(f"{topic}[{partition}]: {exc}") from None
            bounds.setdefault(topic, {})[partition] = end
            if missed:
                mine = holes.setdefault(topic, {})
                mine[partition] = merge_ranges([*mine.get(partition, []), *missed])
        return bounds, holes


@dataclass(frozen=True)
class Slot:
    """What the latest record of a key says: the fields' JSON (None: a tombstone), the
    position (None: a tombstone that keeps none) and the applied count."""

    value: bytes | None
    position: int | None
    applied: int = 0

    @property
    def empty(self) -> bool:
        """No entry and no position: the same as a key never written."""
        return self.value is None and self.position is None

    def headers(self, generation: str, batch_id: int) -> list[tuple[str, str | bytes | None]]:
        out: list[tuple[str, str | bytes | None]] = []
        if self.position is not None:
            out.append((POSITION_HEADER, str(self.position).encode()))
        if self.value is not None:
            out.append((APPLIED_HEADER, str(self.applied).encode()))
        out.append((GENERATION_HEADER, generation.encode()))
        out.append((BATCH_HEADER, str(batch_id).encode()))
        return out

    @classmethod
    def of(cls, value: bytes | None, headers: Iterable[tuple[str, Any]]) -> "Slot":
        found: dict[str, int] = {}
        for name, raw in headers:
            if name in (POSITION_HEADER, APPLIED_HEADER) and raw is not None:
                text = raw.decode() if isinstance(raw, bytes) else str(raw)
                found[name] = int(text)
        position = found.get(POSITION_HEADER)
        if value is not None and position is None:
            position = 0
        return cls(value, position, found.get(APPLIED_HEADER, 0))


# -- reading and producing --------------------------------------------------------------


def _consumer(kafka: KafkaConfig, **fetch: ClientValue) -> Consumer:
    """A group-less consumer for assigned reads: it never joins or commits."""
    overrides: dict[str, ClientValue] = {
        "group.id": f"{kafka.client_id}-store",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_uncommitted",
        # Some brokers (Tansu) hold every fetch for the whole wait: start short.
        "fetch.wait.max.ms": SHORT_WAIT_MS,
        **fetch,
    }
    return Consumer(kafka.client_properties(**overrides))


class RangeReader:
    """The consumer of a store's range reads, and its fetch wait.

    Reads start with a short fetch wait (Tansu holds every fetch that long). On Tansu a short
    wait can stop bringing records below the end of a partition of many small batches (the
    ledger: one record per commit), so when fetches bring nothing for a while the consumer is
    opened again with a longer wait (``connectors.kafka.fetching``) and keeps it: a partition
    that needed it at an offset needs it further on too (its batches before that offset only
    grow in number), and a read up to the log's end comes back as soon as it gets there.
    """

    def __init__(self, kafka: KafkaConfig) -> None:
        self.kafka = kafka
        self.wait = FIRST_FETCH_WAIT_MS
        self.consumer = _consumer(kafka, **{"fetch.wait.max.ms": self.wait})

    def lengthen(self, records: int) -> bool:
        """Open the consumer again with the next longer wait, its fetches sized for about
        ``records`` records; False when the wait is already the longest."""
        longer = longer_wait(self.wait)
        if longer == self.wait:
            return False
        self.consumer.close()
        self.wait = longer
        self.consumer = _consumer(self.kafka, **range_fetch(longer, records))
        log.info("store reads: fetches brought nothing, fetch wait now %d ms", longer)
        return True

    def close(self) -> None:
        self.consumer.close()


def read_ranges(
    reader: RangeReader, ranges: Mapping[PartitionRef, Range], timeout: float, what: str
) -> dict[PartitionRef, list[Message]]:
    """The records of each partition in its ``[start, end)`` range, in offset order. Raises
    :class:`StoreUnavailableError` when no record came for ``timeout`` seconds."""
    out: dict[PartitionRef, list[Message]] = {ref: [] for ref in ranges}
    for batch in iter_ranges(reader, ranges, timeout, what):
        for msg in batch:
            out[(msg.topic() or "", msg.partition() or 0)].append(msg)
    return out


def iter_ranges(
    reader: RangeReader, ranges: Mapping[PartitionRef, Range], timeout: float, what: str
) -> Iterator[list[Message]]:
    """:func:`read_ranges` as the records come, a fetched batch at a time (each partition's
    in offset order; the partitions' interleaved), so a caller holds no more of them than it
    keeps."""
    todo = {ref: r for ref, r in ranges.items() if r[1] > r[0]}
    if not todo:
        return
    cursor = {ref: r[0] for ref, r in todo.items()}
    reader.consumer.assign([TopicPartition(t, p, r[0]) for (t, p), r in todo.items()])
    deadline = time.monotonic() + timeout
    quiet_until = time.monotonic() + stall_s(reader.wait)
    try:
        while todo:
            now = time.monotonic()
            if now > deadline:
                late = ", ".join(
                    f"{t}[{p}] at {cursor[(t, p)]} of {r[1]}" for (t, p), r in todo.items()
                )
                raise StoreUnavailableError(f"{what}: no record for {timeout:.0f}s ({late})")
            # Ask for no more than still expected: consume() waits out its timeout otherwise.
            expected = sum(r[1] - cursor[ref] for ref, r in todo.items())
            if now > quiet_until:
                # Fetches brought nothing for a while: go on from the same positions with a
                # longer wait.
                if reader.lengthen(expected):
                    reader.consumer.assign([TopicPartition(t, p, cursor[(t, p)]) for t, p in todo])
                quiet_until = now + stall_s(reader.wait)
            kept: list[Message] = []
            progressed = False
            for msg in reader.consumer.consume(min(expected, 10_000), timeout=0.5):
                ref = (msg.topic() or "", msg.partition() or 0)
                span = todo.get(ref)
                if span is None:
                    continue
                offset = msg.offset()
                offset = -1 if offset is None else offset
                err = msg.error()
                if err is not None:
                    if err.code() == RdKafkaError._PARTITION_EOF:
                        if cursor[ref] <= offset < span[1]:
                            raise StoreError(
                                f"{what}: {ref[0]}[{ref[1]}] ends at {offset} but the ledger"
                                f" holds records up to {span[1]} (was the topic deleted?)"
                            )
                        continue
                    raise KafkaError(f"{what}: reading {ref[0]}[{ref[1]}]: {err.str()}", err.name())
                if offset < cursor[ref]:
                    continue  # fetched for an earlier assignment
                cursor[ref] = offset + 1
                progressed = True
                if offset < span[1]:
                    kept.append(msg)
                if offset + 1 >= span[1]:
                    del todo[ref]
            if progressed:
                now = time.monotonic()
                deadline, quiet_until = now + timeout, now + stall_s(reader.wait)
            if kept:
                yield kept
    finally:
        reader.consumer.unassign()


RUN_GAP = 512  # offsets apart that one read still covers (a read per record costs a fetch)


def read_offsets(
    reader: RangeReader, wanted: Mapping[PartitionRef, Iterable[int]], timeout: float, what: str
) -> dict[tuple[PartitionRef, int], Message]:
    """The records at these offsets: near ones read together as one range per run, one run
    per partition at a time."""
    runs: dict[PartitionRef, list[Range]] = {}
    for ref, offsets in wanted.items():
        mine: list[Range] = []
        for offset in sorted(set(offsets)):
            if mine and offset - mine[-1][1] < RUN_GAP:
                mine[-1] = (mine[-1][0], offset + 1)
            else:
                mine.append((offset, offset + 1))
        runs[ref] = mine
    found: dict[tuple[PartitionRef, int], Message] = {}
    keep = {(ref, o) for ref, offsets in wanted.items() for o in offsets}
    while any(runs.values()):
        ranges = {ref: rs.pop(0) for ref, rs in runs.items() if rs}
        for batch in iter_ranges(reader, ranges, timeout, what):
            for msg in batch:
                at = ((msg.topic() or "", msg.partition() or 0), msg.offset() or 0)
                if at in keep:
                    found[at] = msg
    return found


class Deliveries:
    """Produces records and waits for every acknowledgement; the offsets they got."""

    def __init__(self, producer: Producer, timeout: float, what: str) -> None:
        self.producer = producer
        self.timeout = timeout
        self.what = what
        self.offsets: dict[PartitionRef, list[int]] = {}
        self.placed: dict[int, tuple[int, int]] = {}  # tracked record -> partition, offset
        self.errors: list[str] = []
        self.sent = 0

    def _done(self, err: RdKafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors.append(f"{msg.topic()}: {err.str()} [{err.name()}]")
            return
        offset = msg.offset()
        if offset is None or offset < 0:
            self.errors.append(f"{msg.topic()}: acknowledged without an offset")
            return
        self.offsets.setdefault((msg.topic() or "", msg.partition() or 0), []).append(offset)

    def _track(self, at: int, err: RdKafkaError | None, msg: Message) -> None:
        self._done(err, msg)
        if err is None:
            self.placed[at] = (msg.partition() or 0, msg.offset() or 0)

    def send(
        self,
        topic: str,
        key: bytes | str,
        value: bytes | str | None,
        headers: list[tuple[str, Any]],
        at: int | None = None,
    ) -> None:
        """Produce one record; ``at``: note where it lands under this number."""
        done = self._done if at is None else functools.partial(self._track, at)
        while True:
            try:
                self.producer.produce(
                    topic, key=key, value=value, headers=headers, on_delivery=done
                )
                self.sent += 1
                return
            except BufferError:
                self.producer.poll(0.05)  # the local queue is full: let deliveries drain

    def wait(self) -> dict[PartitionRef, list[int]]:
        if not self.sent:
            return {}
        remaining = self.producer.flush(self.timeout)
        if remaining:
            raise StoreUnavailableError(
                f"{self.what}: {remaining} record(s) not acknowledged within {self.timeout:.0f}s"
            )
        if self.errors:
            raise StoreError(
                f"{self.what}: Kafka refused {len(self.errors)} record(s), first: {self.errors[0]}"
            )
        return self.offsets


# -- the ledger ---------------------------------------------------------------------------


class LedgerLog:
    """The ledger topic as one view folds it: the latest record per generation name
    (``live`` or a shadow's id), read incrementally from the last offset read."""

    def __init__(self, kafka: KafkaConfig, topic: str, view: str, timeout: float) -> None:
        self.topic = topic
        self.view = view
        self.timeout = timeout
        self.prefix = f"{view}{SEP}"
        self.kafka = kafka
        self.reader = RangeReader(kafka)
        self.next = 0
        self.records: dict[str, GenerationRecord] = {}

    def refresh(self) -> None:
        """Read what was appended since the last read, up to the true end of the ledger."""
        ref = (self.topic, 0)
        try:
            marks = true_watermarks(
                self.reader.consumer, [ref], self.timeout, fresh=lambda: _consumer(self.kafka)
            )
        except KafkaError as exc:
            raise StoreUnavailableError(f"view {self.view}: ledger {self.topic}: {exc}") from exc
        low, high = marks[ref]
        if high < self.next:
            # Recreated, or a broker answering 0 for a partition with an open transaction:
            # either way starting over could lose the live record (and make a new one).
            raise StoreUnavailableError(
                f"view {self.view}: ledger {self.topic} ends at {high}, below the {self.next}"
                " records already read (was it deleted?); restart to read it again"
            )
        start = max(self.next, low)
        if high <= start:
            return
        what = f"view {self.view}: ledger {self.topic}"
        for msg in read_ranges(self.reader, {ref: (start, high)}, self.timeout, what)[ref]:
            self._fold(msg.key(), msg.value())
        self.next = high

    def _fold(self, raw_key: bytes | None, value: bytes | None) -> None:
        if raw_key is None:
            return
        key = raw_key.decode("utf-8", errors="replace")
        if not key.startswith(self.prefix):
            return
        name = key[len(self.prefix) :]
        if value is None:
            self.records.pop(name, None)
            return
        try:
            self.records[name] = GenerationRecord.from_json(value)
        except (ValueError, TypeError, AttributeError) as exc:
            raise StoreError(
                f"view {self.view}: ledger {self.topic} holds a bad record under {key!r}: {exc}"
            ) from exc

    def note(self, name: str, record: GenerationRecord | None, offset: int) -> None:
        """Fold a record this process just produced at ``offset`` without reading it back
        (only when nothing else was appended before it)."""
        if offset == self.next:
            if record is None:
                self.records.pop(name, None)
            else:
                self.records[name] = record
            self.next = offset + 1

    def live(self) -> GenerationRecord | None:
        return self.records.get(LIVE)

    def shadow(self, generation: str) -> GenerationRecord | None:
        return None if generation == LIVE else self.records.get(generation)

    def shadows(self) -> dict[str, GenerationRecord]:
        return {name: r for name, r in self.records.items() if name != LIVE}

    def close(self) -> None:
        self.reader.close()
