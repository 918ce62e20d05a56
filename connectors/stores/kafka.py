"""The Kafka view store: one topic per collection, a ledger topic as the commit point.

No Kafka transactions: exactness comes from a *ledger* that says which offsets of the output
topics hold committed data, so the store works on any Kafka-protocol broker (Tansu included).

Topics (``v`` the view, ``c`` a collection, ``g`` a generation):

- output topics: ``views.v.c`` (or the configured name) per collection, for the live generation,
  kept whole (``cleanup.policy=delete``, ``retention.ms=-1``: compaction could drop a committed
  record whose key has a later, uncommitted one past the bound); a shadow generation ``g``
  writes ``views.v.c.g``. A record's key is the entry key (UTF-8), its value the compact JSON
  of the fields, or no value (a tombstone) for a deleted key; headers ``tributary.position``
  (the entry's position; a tombstone's keeps a deleted key's position, so an old insert cannot
  bring it back), ``tributary.applied``, ``tributary.generation`` and ``tributary.batch``.
  Keys are placed as Java clients place them (murmur2), so :meth:`KafkaStore.get` reads one
  partition;
- the ledger topic (``_tributary_ledger``, compacted, one partition, shared by every view of
  every Kafka store): JSON values keyed ``v\\x1flive`` for the live generation and ``v\\x1fg``
  for each shadow ``g``: the generation, the last batch and the offsets it reached, and per
  output partition the *bound* (the offset after the last committed record) and the *holes*
  (offset ranges below the bound that hold no committed data). A discarded shadow gets a
  tombstone.

A reader of a generation folds the ledger (latest value per key), then reads each output
partition from its start up to the bound, skipping the holes, and keeps the latest record per
key (offset order). One ledger read serves a whole scan, so a scan is one consistent snapshot.

A writer (one per generation) keeps what the position guard needs of the generation's
committed state in memory, in a few bytes per key (:class:`WriterState`: per key the position,
applied count, tombstone and where its latest record is, in numpy columns; the lookup indexes of
collections that declare lookups), never the entries' fields: a materializer's reads fetch them
from the entry's record (or a bounded cache of recent ones). A new writer builds that state from
the committed records of its output topics, a chunk of records at a time. A batch (the unit of
:class:`~connectors.stores.protocol.BatchWriter`, which runs the protocol): read new ledger
records (a live writer whose generation is no longer live stops; a covered batch is skipped; a
gap is refused), guard the writes over the columns, run the materializer on an overlay (only a
store with one builds a Python object per write), produce every changed entry and wait for
every acknowledgement, then produce the ledger record - the commit. The new bound of a
partition is the offset after the last record delivered; every offset between the old bound and
it that is not one of this writer's records is a hole (records of a writer that crashed before
its ledger record, or of a stale writer). A process killed before the ledger record leaves
records past the bound, which readers never see and the next writer turns into holes.

A swap writes into the live topics the difference between the shadow and the live state, then
ONE live ledger record naming the new generation with the live topics' new bounds: readers
switch atomically with that record. The shadow's record is then tombstoned and its topics
deleted.

Output topics are never compacted, so the bounds and holes keep their meaning on any broker;
the ledger topic is compacted (its readers want the latest value per key).
"""

import bisect
import functools
import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from connectors.errors import (
    KafkaError,
    StoreError,
    StoreUnavailableError,
)
from connectors.kafka.admin import TopicAdmin, error_code
from connectors.kafka.config import ClientValue, KafkaConfig
from connectors.kafka.fetching import SHORT_WAIT_MS, longer_wait, range_fetch, stall_s
from connectors.kafka.offsets import true_watermarks
from connectors.kafka.topics import history_topic, state_topic
from connectors.stores.base import Collection, CommitHooks, Materializer, new_generation
from connectors.stores.model import (
    Applied,
    Batch,
    Commit,
    Entry,
    Offsets,
    Put,
    Rejected,
    fields_json,
)
from connectors.stores.positions import ENTRY, GONE, NONE, TOMB, PositionIndex
from connectors.stores.protocol import BatchUnit, BatchWriter
from connectors.stores.writes import WriteColumns, entry_texts, guard

log = logging.getLogger(__name__)

POSITION_HEADER = "tributary.position"
APPLIED_HEADER = "tributary.applied"
GENERATION_HEADER = "tributary.generation"
BATCH_HEADER = "tributary.batch"

LIVE = "live"  # the ledger name of the live generation's record
SEP = "\x1f"  # between the view and the generation in a ledger key

MAX_MESSAGE_BYTES = 1_000_000  # the producer's message.max.bytes (librdkafka's default)
_RECORD_OVERHEAD = 512  # headers and framing, kept free below MAX_MESSAGE_BYTES

FIRST_FETCH_WAIT_MS = SHORT_WAIT_MS  # reads start with it (Tansu holds every fetch that long)

_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_GENERATION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")

# librdkafka / broker errors that mean "cannot reach Kafka now" rather than "Kafka refused".
_UNAVAILABLE = frozenset(
    {
        "_TRANSPORT",
        "_ALL_BROKERS_DOWN",
        "_TIMED_OUT",
        "_MSG_TIMED_OUT",
        "_RESOLVE",
        "_WAIT_COORD",
        "_NO_OFFSET",
        "NETWORK_EXCEPTION",
        "REQUEST_TIMED_OUT",
        "LEADER_NOT_AVAILABLE",
        "NOT_LEADER_FOR_PARTITION",
        "NOT_LEADER_OR_FOLLOWER",
        "BROKER_NOT_AVAILABLE",
        "NOT_ENOUGH_REPLICAS",
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    }
)

Ident = tuple[str, str]  # (collection, key)
PartitionRef = tuple[str, int]  # (topic, partition)
Range = tuple[int, int]  # [start, end) offsets
Bounds = dict[str, dict[int, int]]  # topic -> partition -> offset after the last committed record
Holes = dict[str, dict[int, list[Range]]]  # topic -> partition -> ranges without committed data


# -- pure helpers ---------------------------------------------------------------------------


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of ``data`` (unsigned 32 bits), as the Java client computes it."""
    m = 0x5BD1E995
    mask = 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    end = length - length % 4
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition a keyed record lands in (the Java client's and ``murmur2_random``'s)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


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


def lookup_text(value: Any) -> str | None:
    """The text a lookup compares (what PostgreSQL's ``fields ->> name`` gives; None: null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


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


@dataclass(frozen=True)
class StoredRecord:
    """One output record as read: where it is, its key and what it says."""

    topic: str
    partition: int
    offset: int
    key: str
    slot: Slot


def fold(records: Iterable[StoredRecord]) -> dict[str, Slot]:
    """The latest slot per key (records in offset order within each partition)."""
    out: dict[str, Slot] = {}
    for record in records:
        if record.slot.empty:
            out.pop(record.key, None)
        else:
            out[record.key] = record.slot
    return out


def _entry(collection: str, key: str, slot: Slot) -> Entry | None:
    if slot.value is None:
        return None
    fields = json.loads(slot.value)
    return Entry(collection, key, fields, slot.position or 0, slot.applied)


# -- Kafka clients ------------------------------------------------------------------------


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


def _producer(kafka: KafkaConfig) -> Producer:
    overrides: dict[str, ClientValue] = {
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        # The Java client's partitioner: the same key lands on the same partition whichever
        # client produced it (and :func:`partition_for` finds it).
        "partitioner": "murmur2_random",
        "message.max.bytes": MAX_MESSAGE_BYTES,
    }
    return Producer(kafka.client_properties(**overrides))


def _code(exc: BaseException) -> str | None:
    if isinstance(exc, KafkaError):
        return exc.code
    if isinstance(exc, KafkaException):
        return error_code(exc)
    return None


@contextmanager
def kafka_errors(view: str, what: str) -> Iterator[None]:
    """confluent-kafka's errors as store errors (unreachable: :class:`StoreUnavailableError`)."""
    try:
        yield
    except (KafkaException, KafkaError) as exc:
        code = _code(exc)
        if code in _UNAVAILABLE:
            raise StoreUnavailableError(f"view {view}: Kafka unreachable ({what}): {exc}") from exc
        raise StoreError(f"view {view}: Kafka refused {what}: {exc}") from exc
    except BufferError as exc:
        raise StoreUnavailableError(
            f"view {view}: Kafka producer queue full ({what}): {exc}"
        ) from exc


def read_ranges(
    reader: RangeReader, ranges: Mapping[PartitionRef, Range], timeout: float, what: str
) -> dict[PartitionRef, list[Message]]:
    """The records of each partition in its ``[start, end)`` range, in offset order. Raises
    :class:`StoreUnavailableError` when no record came for ``timeout`` seconds."""
    out: dict[PartitionRef, list[Message]] = {ref: [] for ref in ranges}
    for msg in iter_ranges(reader, ranges, timeout, what):
        out[(msg.topic() or "", msg.partition() or 0)].append(msg)
    return out


def iter_ranges(
    reader: RangeReader, ranges: Mapping[PartitionRef, Range], timeout: float, what: str
) -> Iterator[Message]:
    """:func:`read_ranges` as the records come (each partition's in offset order; the
    partitions' interleaved), so a caller holds no more of them than it keeps."""
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
            for msg in reader.consumer.consume(min(expected, 10_000), timeout=0.5):
                ref = (msg.topic() or "", msg.partition() or 0)
                if ref not in todo:
                    continue
                offset = msg.offset()
                offset = -1 if offset is None else offset
                err = msg.error()
                if err is not None:
                    if err.code() == RdKafkaError._PARTITION_EOF:
                        if cursor[ref] <= offset < todo[ref][1]:
                            raise StoreError(
                                f"{what}: {ref[0]}[{ref[1]}] ends at {offset} but the ledger"
                                f" holds records up to {todo[ref][1]} (was the topic deleted?)"
                            )
                        continue
                    raise KafkaError(f"{what}: reading {ref[0]}[{ref[1]}]: {err.str()}", err.name())
                if offset < cursor[ref]:
                    continue  # fetched for an earlier assignment
                end = todo[ref][1]
                cursor[ref] = offset + 1
                if offset < end:
                    yield msg
                now = time.monotonic()
                deadline, quiet_until = now + timeout, now + stall_s(reader.wait)
                if cursor[ref] >= end:
                    del todo[ref]
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
        for msg in iter_ranges(reader, ranges, timeout, what):
            at = ((msg.topic() or "", msg.partition() or 0), msg.offset() or 0)
            if at in keep:
                found[at] = msg
    return found


def _headers(msg: Message) -> list[tuple[str, Any]]:
    raw = msg.headers()
    if raw is None:
        return []
    return list(raw.items()) if isinstance(raw, dict) else list(raw)


class _Deliveries:
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


# -- the store ----------------------------------------------------------------------------


class KafkaStore:
    """A view's state in Kafka topics, committed through a ledger topic (see the module
    docstring).

    Notes:

    - one writer per generation at a time (a later issue adds leases): a swap racing a live
      batch, or two writers of one generation, can lose a commit; a stale live writer that
      writes *after* a swap is harmless;
    - readers and writers read every record ever written below the bounds: the output topics
      only grow (a replay starts a fresh generation, whose swap rewrites the live topics'
      difference only).
    """

    kind = "kafka"
    timeout = 30.0  # seconds for one read, flush or admin call

    def __init__(
        self,
        kafka: KafkaConfig,
        view: str,
        collections: Sequence[Collection],
        materializer: Materializer | None = None,
        topics: Mapping[str, str] | None = None,
        partitions: int = 1,
        ledger_topic: str = "_tributary_ledger",
    ) -> None:
        if not view or SEP in view:
            raise StoreError(f"view name {view!r} must be non-empty, without \\x1f (Kafka)")
        if partitions < 1:
            raise StoreError(f"view {view}: partitions must be >= 1, got {partitions}")
        self.kafka = kafka
        self.view = view
        self.materializer = materializer
        self.partitions = partitions
        self.ledger_topic = ledger_topic
        self.collections: dict[str, Collection] = {c.name: c for c in collections}
        configured = dict(topics or {})
        unknown = sorted(set(configured) - set(self.collections))
        if unknown:
            raise StoreError(f"view {view}: topics names unknown collections {unknown}")
        self.configured = configured
        self.topics = {c: configured.get(c, f"views.{view}.{c}") for c in self.collections}
        for name in [*self.topics.values(), ledger_topic]:
            if not _TOPIC.fullmatch(name) or name in (".", ".."):
                raise StoreError(f"view {view}: {name!r} is not a valid Kafka topic name")
        if (
            len(set(self.topics.values())) != len(self.topics)
            or ledger_topic in self.topics.values()
        ):
            raise StoreError(f"view {view}: two collections (or the ledger) share a topic")
        self._lock = threading.RLock()  # the reading consumer, the ledger, the admin client
        self._changing = threading.RLock()  # one change of generations at a time
        self._ledger: LedgerLog | None = None
        self._producer: Producer | None = None
        self._admin: TopicAdmin | None = None
        self._ready: set[str] = set()  # topics known to exist with the right settings
        self._checked: set[str] = set()  # topics whose partition count matches

    # -- naming ----------------------------------------------------------------------

    def collection(self, name: str) -> Collection:
        try:
            return self.collections[name]
        except KeyError:
            raise StoreError(
                f"view {self.view} has no collection {name!r}"
                f" (it has {', '.join(sorted(self.collections))})"
            ) from None

    def topic(self, collection: str, shadow: str | None = None) -> str:
        """The output topic of a collection in a shadow generation (None: the live one)."""
        base = self.topics[collection]
        return base if shadow is None else f"{base}.{shadow}"

    def generation_topics(self, shadow: str | None) -> dict[str, str]:
        return {c: self.topic(c, shadow) for c in self.collections}

    def _check_generation(self, generation: str) -> None:
        if generation == LIVE or not _GENERATION.fullmatch(generation):
            raise StoreError(
                f"view {self.view}: generation {generation!r} must be letters, digits, _ or -"
                f" (and not {LIVE!r})"
            )
        for collection in self.collections:
            if len(self.topic(collection, generation)) > 249:
                raise StoreError(f"view {self.view}: generation {generation!r} is too long")

    @contextmanager
    def errors(self, what: str) -> Iterator[None]:
        with kafka_errors(self.view, what):
            yield

    # -- clients (the consumer and the ledger under _lock) ----------------------------------

    def admin(self) -> TopicAdmin:
        if self._admin is None:
            self._admin = TopicAdmin(self.kafka, timeout=self.timeout)
        return self._admin

    def ensure_topics(self, names: Iterable[str], partitions: int | None = None) -> None:
        for name in names:
            if name not in self._ready:
                count = partitions or self.partitions
                spec = (
                    state_topic(name, count)
                    if name == self.ledger_topic
                    else history_topic(name, count)
                )
                self.admin().ensure(spec)
                self._ready.add(name)
                self._checked.add(name)

    def ledger(self) -> LedgerLog:
        if self._ledger is None:
            self.ensure_topics([self.ledger_topic], 1)
            self._ledger = LedgerLog(self.kafka, self.ledger_topic, self.view, self.timeout)
        return self._ledger

    def _reader(self) -> RangeReader:
        """The reader of every read (the ledger's: one per store object)."""
        return self.ledger().reader

    def producer(self) -> Producer:
        """The store's idempotent producer, shared by its writers (starting one takes
        half a second on some brokers)."""
        with self._lock:
            if self._producer is None:
                self._producer = _producer(self.kafka)
            return self._producer

    def _send(self, what: str) -> _Deliveries:
        return _Deliveries(self.producer(), self.timeout, f"view {self.view}: {what}")

    def _put_record(self, name: str, record: GenerationRecord | None, what: str) -> None:
        """Produce one ledger record (None: a tombstone) and wait for it."""
        sending = self._send(what)
        value = None if record is None else record.to_json()
        key = ledger_key(self.view, None if name == LIVE else name)
        sending.send(self.ledger_topic, key.encode(), value, [])
        [offset] = sending.wait()[(self.ledger_topic, 0)]
        with self._lock:
            self.ledger().note(name, record, offset)

    def _current(self) -> LedgerLog:
        """The ledger read up to its end now (call under _lock)."""
        ledger = self.ledger()
        ledger.refresh()
        return ledger

    # -- reading a generation ----------------------------------------------------------

    def read_slots(
        self,
        reader: RangeReader,
        record: GenerationRecord,
        topics: Mapping[str, str],
        only: Mapping[str, int] | None = None,
    ) -> dict[str, dict[str, Slot]]:
        """The latest slot per key of each collection (collection -> topic) in the committed
        data of ``record`` (``only``: read just this partition of a collection)."""
        ranges: dict[PartitionRef, Range] = {}
        for collection, topic in topics.items():
            for partition, end in record.bounds.get(topic, {}).items():
                if only is not None and only.get(collection, partition) != partition:
                    continue
                if partition >= self.partitions:
                    raise StoreError(
                        f"view {self.view}: {topic} has partition {partition}, the store is"
                        f" configured with {self.partitions}"
                    )
                ranges[(topic, partition)] = (0, end)
        what = f"view {self.view}: generation {record.generation}"
        found = read_ranges(reader, ranges, self.timeout, what)
        out: dict[str, dict[str, Slot]] = {}
        for collection, topic in topics.items():
            stored: list[StoredRecord] = []
            for (t, partition), messages in sorted(found.items()):
                if t != topic:
                    continue
                holes = record.holes_of(t, partition)
                for msg in messages:
                    offset = msg.offset() or 0
                    raw_key = msg.key()
                    if raw_key is None or (holes and in_ranges(holes, offset)):
                        continue
                    slot = Slot.of(msg.value(), _headers(msg))
                    stored.append(StoredRecord(t, partition, offset, raw_key.decode(), slot))
            out[collection] = fold(stored)
        return out

    def _resolve(self, generation: str | None) -> tuple[GenerationRecord | None, str | None]:
        """The record to read a generation by (None: the live one) and its shadow id."""
        ledger = self._current()
        live = ledger.live()
        if generation is None or (live is not None and live.generation == generation):
            return live, None
        return ledger.shadow(generation), generation

    def _check_partitions(self, topic: str) -> None:
        if topic in self._checked:
            return
        found = self.admin().partition_count(topic)
        if found is not None and found != self.partitions:
            raise StoreError(
                f"view {self.view}: topic {topic} has {found} partitions, the store is configured"
                f" with {self.partitions}"
            )
        self._checked.add(topic)

    # -- generations -----------------------------------------------------------------

    def live_generation(self) -> str:
        with self.errors("reading the live generation"):
            with self._lock:
                live = self._current().live()
            if live is not None:
                return live.generation
            with self._changing:
                with self._lock:
                    live = self._current().live()
                    if live is not None:
                        return live.generation
                    self.ensure_topics(self.generation_topics(None).values())
                record = GenerationRecord(new_generation())
                self._put_record(LIVE, record, "creating the live generation")
                with self._lock:  # another process may have created one too: the latest wins
                    live = self._current().live()
        if live is None:
            raise StoreError(f"view {self.view}: the live record vanished from the ledger")
        return live.generation

    def committed(self, generation: str) -> Commit:
        with self._lock, self.errors("reading the ledger"):
            ledger = self._current()
        live = ledger.live()
        if live is not None and live.generation == generation:
            return live.commit(self.view)
        shadow = ledger.shadow(generation)
        if shadow is not None:
            return shadow.commit(self.view)
        return Commit.empty(self.view, generation)

    def writer(
        self, generation: str, *, live: bool, hooks: CommitHooks | None = None
    ) -> "KafkaWriter":
        return KafkaWriter(self, generation, live=live, hooks=hooks or CommitHooks())

    def prepare(self, generation: str) -> None:
        self._check_generation(generation)
        with self._changing:
            self.discard(generation)
            with self.errors("preparing a generation"):
                with self._lock:
                    self.ensure_topics(self.generation_topics(generation).values())
                record = GenerationRecord(generation)
                self._put_record(generation, record, "preparing a generation")

    def generations(self) -> set[str]:
        with self._lock, self.errors("listing generations"):
            ledger = self._current()
            found = set(ledger.shadows())
            live = ledger.live()
        if live is not None:
            found.add(live.generation)
        return found

    def discard(self, generation: str) -> None:
        with self._changing, self.errors("discarding a generation"):
            with self._lock:
                ledger = self._current()
                live, shadow = ledger.live(), ledger.shadow(generation)
            if live is not None and live.generation == generation:
                raise StoreError(f"view {self.view}: generation {generation} is live; not dropped")
            if shadow is not None:
                self._put_record(generation, None, "discarding a generation")
            if generation != LIVE:
                self._drop_topics(generation)

    def _drop_topics(self, generation: str) -> None:
        shadow = set(self.generation_topics(generation).values())
        with self._lock:
            existing = shadow & set(self.admin().topic_names())
            self._ready.difference_update(shadow)
            self._checked.difference_update(shadow)
            self.admin().delete(*sorted(existing))

    def swap_in(self, generation: str) -> str | None:
        with self._changing, self.errors("swapping generations"):
            live_topics = self.generation_topics(None)
            with self._lock:
                ledger = self._current()
                live, shadow = ledger.live(), ledger.shadow(generation)
                if live is not None and live.generation == generation:
                    return generation
                if shadow is None:
                    raise StoreError(
                        f"view {self.view}: generation {generation} is not in use (no ledger"
                        " record); prepare it before swapping it in"
                    )
                self.ensure_topics(live_topics.values())
                base = GenerationRecord(generation) if live is None else live
                new = self.read_slots(self._reader(), shadow, self.generation_topics(generation))
                old = self.read_slots(self._reader(), base, live_topics)
            # The difference goes past the live bounds: readers do not see it yet.
            sending = self._send(f"swapping in generation {generation}")
            for collection, topic in live_topics.items():
                before, after = old[collection], new[collection]
                for key in sorted(set(before) | set(after)):
                    want = after.get(key, Slot(None, None))
                    if want != before.get(key, Slot(None, None)):
                        headers = want.headers(generation, shadow.batch_id)
                        sending.send(topic, key.encode(), want.value, headers)
            delivered = sending.wait()
            try:
                bounds, holes = base.advanced(delivered)
            except ValueError as exc:
                raise StoreError(
                    f"view {self.view}: the live topics changed under the ledger ({exc})"
                ) from exc
            record = GenerationRecord(
                generation, shadow.batch_id, shadow.offsets, shadow.batches, bounds, holes
            )
            # The commit point: readers switch to the new generation with this one record.
            self._put_record(LIVE, record, f"swapping in generation {generation}")
            self._put_record(generation, None, f"retiring shadow {generation}")
            self._drop_topics(generation)
            return None if live is None else live.generation

    # -- reads -----------------------------------------------------------------------

    def get(self, collection: str, key: str, generation: str | None = None) -> Entry | None:
        self.collection(collection)
        with self._lock, self.errors("reading an entry"):
            record, shadow = self._resolve(generation)
            if record is None:
                return None
            topic = self.topic(collection, shadow)
            self._check_partitions(topic)
            partition = partition_for(key.encode(), self.partitions)
            slots = self.read_slots(
                self._reader(), record, {collection: topic}, only={collection: partition}
            )
        slot = slots[collection].get(key)
        return None if slot is None else _entry(collection, key, slot)

    def scan(self, collection: str, generation: str | None = None) -> list[Entry]:
        self.collection(collection)
        with self._lock, self.errors("scanning a collection"):
            record, shadow = self._resolve(generation)
            if record is None:
                return []
            slots = self.read_slots(
                self._reader(), record, {collection: self.topic(collection, shadow)}
            )
        out = [_entry(collection, key, slot) for key, slot in sorted(slots[collection].items())]
        return [e for e in out if e is not None]

    def describe(self) -> str:
        if self.configured:
            where = " ".join(self.topics[c] for c in self.collections)
        else:
            where = f"views.{self.view}.*"
        return f"kafka {self.kafka.bootstrap_servers} {where}"

    def close(self) -> None:
        with self._changing, self._lock:
            if self._ledger is not None:
                self._ledger.close()
                self._ledger = None
            if self._producer is not None:
                self._producer.flush(self.timeout)
                self._producer = None


# -- the writer's state and the materializer's transaction -------------------------------


@dataclass(frozen=True)
class _State:
    """A pending entry of a unit: parsed fields, their exact JSON, position, count."""

    fields: Mapping[str, Any]
    text: str
    position: int
    applied: int

    def entry(self, collection: str, key: str) -> Entry:
        return Entry(collection, key, json.loads(self.text), self.position, self.applied)

    def slot(self) -> Slot:
        return Slot(self.text.encode(), self.position, self.applied)


def _state_of(fields: Mapping[str, Any], position: int, applied: int) -> _State:
    text = fields_json(fields)
    parsed = json.loads(text)
    if not isinstance(parsed, dict):
        raise ValueError(f"fields must be a JSON object, got {text[:80]!r}")
    return _State(parsed, text, position, applied)


def _lookup_texts(value: bytes | str | None, names: Sequence[str]) -> tuple[str | None, ...]:
    """The lookup texts of an entry's JSON (all None for no entry)."""
    if value is None:
        return (None,) * len(names)
    fields = json.loads(value)
    if not isinstance(fields, dict):
        return (None,) * len(names)
    return tuple(lookup_text(fields.get(name)) for name in names)


@dataclass
class Folded:
    """The latest record of distinct keys of one collection, as columns: what a writer folds
    into its state (from its own commit, or read back from the topics)."""

    keys: pa.Array  # string
    position: np.ndarray  # NONE: none (a derived delete)
    applied: np.ndarray
    state: np.ndarray  # ENTRY, TOMB or GONE
    partition: np.ndarray  # -1: not known (a store without a materializer does not ask)
    offset: np.ndarray
    values: list[bytes | str | None] | None = None  # entries' JSON (for lookups)


class WriterState:
    """A generation's committed state in a writer's memory: per collection a
    :class:`~connectors.stores.positions.PositionIndex` (position, applied count, tombstone and
    where the latest record is, per key), and for collections that declare lookups the keys
    per lookup value. No entry's fields are kept: a materializer's reads fetch them."""

    def __init__(self, collections: Mapping[str, Collection]) -> None:
        self.collections = collections
        self.keys: dict[str, PositionIndex] = {c: PositionIndex() for c in collections}
        self.lookups: dict[tuple[str, str], dict[str, set[str]]] = {
            (c.name, f): {} for c in collections.values() for f in c.lookups
        }
        # collection -> key -> its entry's lookup texts (collections with lookups only)
        self._texts: dict[str, dict[str, tuple[str | None, ...]]] = {
            c.name: {} for c in collections.values() if c.lookups
        }

    def fold(self, collection: str, folded: Folded) -> None:
        """Fold the latest records of distinct keys in."""
        index = self.keys[collection]
        index.set(
            folded.keys,
            index.find(folded.keys),
            folded.position,
            folded.applied,
            folded.state,
            folded.partition,
            folded.offset,
        )
        names = self.collections[collection].lookups
        if not names:
            return
        texts = self._texts[collection]
        if folded.values is None:
            raise ValueError(f"{collection} has lookups: its entries' values are needed")
        for key, state, value in zip(
            folded.keys.to_pylist(), folded.state.tolist(), folded.values, strict=True
        ):
            new = _lookup_texts(value if state == ENTRY else None, names)
            old = texts.pop(key, (None,) * len(names))
            if any(t is not None for t in new):
                texts[key] = new
            for name, before, after in zip(names, old, new, strict=True):
                if before == after:
                    continue
                index_of = self.lookups[(collection, name)]
                if before is not None:
                    holders = index_of.get(before)
                    if holders is not None:
                        holders.discard(key)
                        if not holders:
                            del index_of[before]
                if after is not None:
                    index_of.setdefault(after, set()).add(key)

    def keys_with(self, collection: str, field_name: str, text: str) -> set[str]:
        return set(self.lookups[(collection, field_name)].get(text, ()))

    def slots_of(self, collection: str, keys: Sequence[str]) -> list[tuple[Slot, tuple[int, int]]]:
        """What the state says of keys (an entry's value not read: ``b""``) and where their
        records are."""
        index = self.keys[collection]
        if len(keys) < 16:  # a materializer's gets: one key at a time
            slots = [index.find_one(key) for key in keys]
        else:
            slots = index.find(pa.array(list(keys), pa.string())).tolist()
        out: list[tuple[Slot, tuple[int, int]]] = []
        for slot in slots:
            if slot < 0 or index.state[slot] == GONE:
                out.append((Slot(None, None), (-1, -1)))
                continue
            position, applied = int(index.position[slot]), int(index.applied[slot])
            where = (int(index.partition[slot]), int(index.offset[slot]))
            if index.state[slot] == TOMB:
                out.append((Slot(None, position), where))
            else:
                out.append((Slot(b"", position, applied), where))
        return out

    def slot_of(self, collection: str, key: str) -> tuple[Slot, tuple[int, int]]:
        return self.slots_of(collection, [key])[0]

    @property
    def nbytes(self) -> int:
        return sum(index.nbytes for index in self.keys.values())


class EntryCache:
    """The values of recently written or read entries, by key, up to ``limit`` bytes; a miss
    is read from the entry's record in its topic."""

    def __init__(self, limit: int = 64 << 20) -> None:
        self.limit = limit
        self.size = 0
        self._values: OrderedDict[Ident, tuple[int, int, bytes]] = OrderedDict()

    def get(self, ident: Ident, where: tuple[int, int]) -> bytes | None:
        found = self._values.get(ident)
        if found is None or found[:2] != where:
            return None
        self._values.move_to_end(ident)
        return found[2]

    def put(self, ident: Ident, where: tuple[int, int], value: bytes) -> None:
        old = self._values.pop(ident, None)
        if old is not None:
            self.size -= len(old[2])
        if where[1] < 0 or len(value) > self.limit:
            return
        self._values[ident] = (*where, value)
        self.size += len(value)
        while self.size > self.limit:
            _, (_, _, dropped) = self._values.popitem(last=False)
            self.size -= len(dropped)


class KafkaTxn:
    """One batch's unit on Kafka, as the materializer sees it (the
    :class:`~connectors.stores.base.StoreTxn` of the Kafka store): reads see the unit's pending
    writes first, then the committed state (an entry's fields read from its record, or the
    writer's cache); nothing reaches Kafka until the writer produces :meth:`changes`."""

    def __init__(self, store: "KafkaStore", writer: "KafkaWriter", state: WriterState) -> None:
        self.store = store
        self.writer = writer
        self.state = state
        self._committed: dict[Ident, Slot] = {}
        self._pending: dict[Ident, _State | None] = {}  # None: deleted in this unit
        self._tombs: dict[Ident, int | None] = {}  # positions of deleted keys (None: cleared)

    def committed(self, idents: Sequence[Ident]) -> None:
        """Read the committed slots of keys (entries' values in one read)."""
        todo = [i for i in dict.fromkeys(idents) if i not in self._committed]
        by_collection: dict[str, list[str]] = {}
        for collection, key in todo:
            by_collection.setdefault(collection, []).append(key)
        located: dict[Ident, tuple[Slot, tuple[int, int]]] = {}
        for collection, keys in by_collection.items():
            for key, found in zip(keys, self.state.slots_of(collection, keys), strict=True):
                located[(collection, key)] = found
        wanted = {i: where for i, (slot, where) in located.items() if slot.value is not None}
        values = self.writer.values(wanted)
        for ident, (slot, _) in located.items():
            if slot.value is not None:
                slot = Slot(values[ident], slot.position, slot.applied)
            self._committed[ident] = slot

    def _slot(self, ident: Ident) -> Slot:
        if ident not in self._committed:
            self.committed([ident])
        return self._committed[ident]

    def _current(self, ident: Ident) -> _State | None:
        if ident in self._pending:
            return self._pending[ident]
        slot = self._slot(ident)
        if slot.value is None:
            return None
        fields = json.loads(slot.value)
        return _State(fields, slot.value.decode(), slot.position or 0, slot.applied)

    # -- the position guard's survivors (the batch's own writes) -------------------------

    def stage_batch(
        self,
        writes: WriteColumns,
        rows: np.ndarray,
        counts: np.ndarray,
        texts: list[str | None],
    ) -> list[Applied]:
        """Stage the batch's writes that passed the guard (``rows``, with their entries'
        JSON, None for the refused ones); the staged ones, with their entries' fields before."""
        idents = [
            (writes.collections[code], key)
            for code, key in zip(
                writes.collection_codes[rows].tolist(), writes.column("key", rows), strict=True
            )
        ]
        self.committed(idents)
        applied: list[Applied] = []
        objects = writes.writes(rows)
        for i, row in enumerate(rows.tolist()):
            ident = idents[i]
            write = objects[i]
            stored = self._committed[ident]
            if isinstance(write, Put):
                text = texts[i]
                if text is None:
                    continue  # refused
                self._pending[ident] = _State(
                    json.loads(text), text, write.position, int(counts[row])
                )
                self._tombs[ident] = None
            else:
                self._pending[ident] = None
                self._tombs[ident] = write.position
            before = None if stored.value is None else json.loads(stored.value)
            applied.append(Applied(write, before))
        return applied

    # -- StoreTxn ------------------------------------------------------------------------

    def get(self, collection: str, key: str) -> Entry | None:
        self.store.collection(collection)
        state = self._current((collection, key))
        return None if state is None else state.entry(collection, key)

    def find(self, collection: str, field: str, value: Any) -> list[Entry]:
        lookups = self.store.collection(collection).lookups
        if field not in lookups:
            raise StoreError(
                f"view {self.store.view}: {field} is not a lookup of {collection}"
                f" (lookups: {', '.join(lookups) or 'none'})"
            )
        wanted = lookup_text(value)
        if wanted is None:
            return []
        keys = self.state.keys_with(collection, field, wanted)
        keys.update(k for c, k in self._pending if c == collection)
        self.committed([(collection, k) for k in keys])
        out: list[Entry] = []
        for key in sorted(keys):
            state = self._current((collection, key))
            if state is not None and lookup_text(state.fields.get(field)) == wanted:
                out.append(state.entry(collection, key))
        return out

    def put(self, collection: str, key: str, fields: Mapping[str, Any]) -> None:
        self.store.collection(collection)
        ident = (collection, key)
        current = self._current(ident)
        position, applied = (0, 0) if current is None else (current.position, current.applied)
        try:
            self._pending[ident] = _state_of(fields, position, applied)
        except (TypeError, ValueError) as exc:
            raise StoreError(
                f"view {self.store.view}: derived write {collection}/{key}: {exc}"
            ) from exc

    def delete(self, collection: str, key: str) -> None:
        self.store.collection(collection)
        self._slot((collection, key))
        self._pending[(collection, key)] = None

    # -- what to produce -----------------------------------------------------------------

    def changes(self) -> list[tuple[Ident, Slot]]:
        """The slot of every key this unit changed (derived writes that change nothing and
        derived deletes of absent keys are left out)."""
        out: list[tuple[Ident, Slot]] = []
        for ident in dict.fromkeys([*self._pending, *self._tombs]):
            before = self._slot(ident)
            if ident in self._pending:
                final = self._pending[ident]
                if final is not None:
                    after = final.slot()
                elif ident in self._tombs:  # a guarded delete keeps the key's position
                    after = Slot(None, self._tombs[ident])
                elif before.value is None:  # a derived delete of an absent key
                    after = before
                else:  # a derived delete keeps no position
                    after = Slot(None, None)
            else:
                after = before
            if after != before:
                out.append((ident, after))
        return out


# -- the writer -------------------------------------------------------------------------


@dataclass
class _Outgoing:
    """The records of one collection a unit produces, as columns."""

    keys: list[str]
    values: list[str | bytes | None]  # the entry's JSON (None: a tombstone)
    positions: np.ndarray  # NONE: no position (a derived delete)
    applied: np.ndarray

    @classmethod
    def of(cls, changes: Sequence[tuple[str, Slot]]) -> "_Outgoing":
        """The records of slots a materializer's unit changed."""
        return cls(
            [key for key, _ in changes],
            [slot.value for _, slot in changes],
            np.array(
                [NONE if s.position is None else s.position for _, s in changes], dtype=np.int64
            ),
            np.array([s.applied for _, s in changes], dtype=np.int64),
        )

    def states(self) -> np.ndarray:
        entries = np.array([v is not None for v in self.values], dtype=bool)
        return np.where(entries, ENTRY, np.where(self.positions != NONE, TOMB, GONE)).astype(
            np.int8
        )


class KafkaWriter(BatchWriter):
    """Applies batches to one generation of a Kafka view store (one writer per generation)."""

    def __init__(
        self, store: KafkaStore, generation: str, *, live: bool, hooks: CommitHooks
    ) -> None:
        self.store = store
        self.view = store.view
        self.materializer = store.materializer
        self.generation = generation
        self.live = live
        self.hooks = hooks
        self.shadow = None if live else generation
        self.topics = store.generation_topics(self.shadow)
        self._state: WriterState | None = None
        self._known: GenerationRecord | None = None  # the record the state reflects
        self._ready = False
        self._cache = EntryCache()

    def committed(self) -> Commit:
        return self.store.committed(self.generation)

    def close(self) -> None:
        """Drop the in-memory state (the store owns the Kafka clients)."""
        self._state = None
        self._known = None
        self._cache = EntryCache()

    @contextmanager
    def unit(self, batch: Batch) -> Iterator["KafkaUnit"]:
        """Nothing to open: the data is produced past the ledger's bounds, the ledger
        record commits it."""
        with self.store.errors(f"batch {batch.batch_id}"):
            yield KafkaUnit(self, batch)

    # -- the ledger and the committed state ---------------------------------------------

    def record(self, ledger: LedgerLog) -> GenerationRecord:
        """This generation's ledger record as ``ledger`` (read up to its end) holds it."""
        store = self.store
        live = ledger.live()
        if self.live:
            if live is None or live.generation != self.generation:
                raise self.stale(None if live is None else live.generation)
            return live
        if live is not None and live.generation == self.generation:
            raise StoreError(
                f"view {store.view}: generation {self.generation} was swapped in; its shadow"
                " writer stops (write it as the live generation)"
            )
        record = ledger.shadow(self.generation)
        if record is None:
            raise StoreError(
                f"view {store.view}: generation {self.generation} is not prepared (or was"
                " discarded)"
            )
        return record

    def state(self, record: GenerationRecord) -> WriterState:
        """The state of ``record``'s committed data, kept while nobody else commits to the
        generation (under the lock)."""
        if (
            self._state is not None
            and self._known is not None
            and self._known.to_json() == record.to_json()
        ):
            return self._state
        store = self.store
        if not self._ready:
            store.ensure_topics(self.topics.values())
            self._ready = True
        self._state, self._cache = None, EntryCache()
        self._state, self._known = self._rebuild(record), record
        return self._state

    def _rebuild(self, record: GenerationRecord) -> WriterState:
        """The state, from the committed records of the output topics: one partition at a
        time, in chunks folded column-wise (the latest record per key wins)."""
        store = self.store
        state = WriterState(store.collections)
        reader = store._reader()
        what = f"view {store.view}: generation {record.generation}"
        for collection, topic in self.topics.items():
            lookups = bool(store.collection(collection).lookups)
            for partition, end in sorted(record.bounds.get(topic, {}).items()):
                if partition >= store.partitions:
                    raise StoreError(
                        f"view {store.view}: {topic} has partition {partition}, the store is"
                        f" configured with {store.partitions}"
                    )
                chunk = _Chunk(partition, record.holes_of(topic, partition), lookups)
                for msg in iter_ranges(reader, {(topic, partition): (0, end)}, store.timeout, what):
                    chunk.add(msg)
                    if chunk.full:
                        state.fold(collection, chunk.folded())
                if chunk.rows:
                    state.fold(collection, chunk.folded())
        return state

    def values(self, wanted: Mapping[Ident, tuple[int, int]]) -> dict[Ident, bytes]:
        """The values of committed entries (ident -> partition, offset of its record): the
        cache's, the rest read from the topics."""
        out: dict[Ident, bytes] = {}
        missing: dict[PartitionRef, list[int]] = {}
        for ident, where in wanted.items():
            value = self._cache.get(ident, where)
            if value is not None:
                out[ident] = value
            else:
                missing.setdefault((self.topics[ident[0]], where[0]), []).append(where[1])
        if not missing:
            return out
        store = self.store
        for ref, offsets in missing.items():
            if min(offsets) < 0:
                raise StoreError(
                    f"view {store.view}: the writer does not know where an entry of {ref[0]} is"
                )
        with store._lock:
            found = read_offsets(
                store._reader(), missing, store.timeout, f"view {store.view}: reading entries"
            )
        for ident, where in wanted.items():
            if ident in out:
                continue
            msg = found.get(((self.topics[ident[0]], where[0]), where[1]))
            value = None if msg is None else msg.value()
            if value is None:
                raise StoreError(
                    f"view {store.view}: the record of {ident[0]}/{ident[1]} at"
                    f" {self.topics[ident[0]]}[{where[0]}]@{where[1]} is gone"
                )
            self._cache.put(ident, where, value)
            out[ident] = value
        return out

    def commit_record(self, record: GenerationRecord, what: str) -> None:
        """Produce the generation's ledger record: the commit point of the batch."""
        store = self.store
        committing = _Deliveries(store.producer(), store.timeout, f"{what}: commit")
        key = ledger_key(store.view, self.shadow)
        committing.send(store.ledger_topic, key.encode(), record.to_json(), [])
        [offset] = committing.wait()[(store.ledger_topic, 0)]
        with store._lock:
            store.ledger().note(LIVE if self.live else self.generation, record, offset)


class _Chunk:
    """Records of one output partition read back, collected until they are folded."""

    SIZE = 50_000

    def __init__(self, partition: int, holes: list[Range], lookups: bool) -> None:
        self.partition = partition
        self.holes = np.array(holes, dtype=np.int64).reshape(-1, 2)
        self.lookups = lookups
        self._clear()

    def _clear(self) -> None:
        self.keys: list[bytes] = []
        self.offsets: list[int] = []
        self.positions: list[int] = []
        self.applied: list[int] = []
        self.states: list[int] = []
        self.values: list[bytes | None] = []

    @property
    def rows(self) -> int:
        return len(self.keys)

    @property
    def full(self) -> bool:
        return len(self.keys) >= self.SIZE

    def add(self, msg: Message) -> None:
        key = msg.key()
        if key is None:
            return
        value = msg.value()
        position: int | None = None
        applied = 0
        for name, raw in _headers(msg):
            if name == POSITION_HEADER and raw is not None:
                position = int(raw)
            elif name == APPLIED_HEADER and raw is not None:
                applied = int(raw)
        if value is not None:
            state = ENTRY
            position = 0 if position is None else position
        else:
            state = TOMB if position is not None else GONE
        self.keys.append(key)
        self.offsets.append(msg.offset() or 0)
        self.positions.append(NONE if position is None else position)
        self.applied.append(applied)
        self.states.append(state)
        if self.lookups:
            self.values.append(value)

    def folded(self) -> Folded:
        """The latest record per key of the chunk (records in holes left out), and clear."""
        offsets = np.array(self.offsets, dtype=np.int64)
        keep = np.ones(len(offsets), dtype=bool)
        if len(self.holes):
            at = np.searchsorted(self.holes[:, 0], offsets, side="right") - 1
            inside = (at >= 0) & (offsets < self.holes[np.maximum(at, 0), 1])
            keep &= ~inside
        try:
            keys = pa.array(self.keys, pa.binary()).cast(pa.string())
        except pa.ArrowInvalid as exc:
            raise StoreError(f"an output record's key is not UTF-8: {exc}") from exc
        rows = np.flatnonzero(keep)
        if len(rows):  # the last record of each key
            grouped = (
                pa.table({"k": keys.take(pa.array(rows)), "i": pa.array(rows)})
                .group_by("k", use_threads=False)
                .aggregate([("i", "max")])
            )
            rows = np.sort(np.asarray(grouped["i_max"].to_numpy(), dtype=np.int64))
        take = pa.array(rows, pa.int64())
        out = Folded(
            keys.take(take),
            np.array(self.positions, dtype=np.int64)[rows],
            np.array(self.applied, dtype=np.int64)[rows],
            np.array(self.states, dtype=np.int8)[rows],
            np.full(len(rows), self.partition, dtype=np.int32),
            offsets[rows],
            [self.values[i] for i in rows.tolist()] if self.lookups else None,
        )
        self._clear()
        return out


class KafkaUnit(BatchUnit):
    """One batch on Kafka: the guard against the writer's state, the produce, the ledger
    record."""

    def __init__(self, writer: KafkaWriter, batch: Batch) -> None:
        self.writer = writer
        self.store = writer.store
        self.batch = batch
        self.what = f"view {writer.view}: batch {batch.batch_id} of generation {writer.generation}"
        self._ledger: LedgerLog | None = None  # read up to its end in this unit
        self._record: GenerationRecord | None = None
        self._state: WriterState | None = None
        self._txn: KafkaTxn | None = None
        self._outgoing: dict[str, _Outgoing] = {}
        self._new: GenerationRecord | None = None
        self._placed: dict[str, np.ndarray] = {}  # collection -> partition, offset per record

    def live_generation(self) -> str | None:
        with self.store._lock:
            self._ledger = self.store._current()
            live = self._ledger.live()
        return None if live is None else live.generation

    def ledger(self) -> Commit:
        with self.store._lock:
            if self._ledger is None:
                self._ledger = self.store._current()
            record = self.writer.record(self._ledger)
            self._state = self.writer.state(record)
        self._record = record
        return record.commit(self.store.view)

    def write(self, writes: WriteColumns, rejected: list[Rejected], applied: bool) -> list[Applied]:
        store, state = self.store, self._state
        assert state is not None
        for collection in writes.collections:
            store.collection(collection)
        n = writes.n
        stored = np.full(n, NONE, dtype=np.int64)
        counts = np.zeros(n, dtype=np.int64)
        tomb = np.full(n, NONE, dtype=np.int64)
        for collection in writes.collections:
            rows = writes.rows_of(collection)
            index = state.keys[collection]
            slots = index.find(writes.table["key"].take(pa.array(rows, pa.int64())))
            found = slots >= 0
            at = slots[found]
            kind = index.state[at]
            mine = rows[found]
            stored[mine] = np.where(kind == ENTRY, index.position[at], NONE)
            counts[mine] = np.where(kind == ENTRY, index.applied[at], 0)
            tomb[mine] = np.where(kind == TOMB, index.position[at], NONE)
        passed, after = guard(writes, stored, counts, tomb)
        rows = np.flatnonzero(passed)
        texts, errors = entry_texts(writes, rows)
        sizes = pc.add(
            pc.binary_length(pa.array(texts, pa.string())).fill_null(0),
            pc.binary_length(writes.table["key"].combine_chunks().take(pa.array(rows, pa.int64()))),
        ).to_numpy(zero_copy_only=False)
        for i in np.flatnonzero(sizes + _RECORD_OVERHEAD > MAX_MESSAGE_BYTES).tolist():
            if texts[i] is not None:
                size = int(sizes[i]) + _RECORD_OVERHEAD
                errors[int(rows[i])] = f"record of {size} bytes exceeds {MAX_MESSAGE_BYTES}"
                texts[i] = None
        for row, reason in sorted(errors.items()):
            rejected.append(Rejected(writes.write(row), reason))
        if applied:
            self._txn = KafkaTxn(store, self.writer, state)
            return self._txn.stage_batch(writes, rows, after, texts)
        ok = writes.deleted[rows] | np.array([t is not None for t in texts], dtype=bool)
        codes = writes.collection_codes[rows]
        for code, collection in enumerate(writes.collections):
            mine = np.flatnonzero(ok & (codes == code))
            if not len(mine):
                continue
            self._outgoing[collection] = _Outgoing(
                writes.column("key", rows[mine]),
                [texts[i] for i in mine.tolist()],
                writes.position[rows[mine]],
                after[rows[mine]],
            )
        return []

    def txn(self) -> KafkaTxn:
        if self._txn is None:
            assert self._state is not None
            self._txn = KafkaTxn(self.store, self.writer, self._state)
        return self._txn

    def outgoing(self) -> dict[str, _Outgoing]:
        """The records the unit produces, per collection."""
        if self._txn is not None:
            grouped: dict[str, list[tuple[str, Slot]]] = {}
            for (collection, key), slot in self._txn.changes():
                grouped.setdefault(collection, []).append((key, slot))
            self._outgoing = {c: _Outgoing.of(changes) for c, changes in grouped.items()}
            self._txn = None
        return self._outgoing

    def records(self) -> dict[Ident, Slot]:
        """The slot of each record the unit produces (for tests and logs)."""
        out: dict[Ident, Slot] = {}
        for collection, records in self.outgoing().items():
            positions = records.positions.tolist()
            for key, value, position, applied in zip(
                records.keys, records.values, positions, records.applied.tolist(), strict=True
            ):
                data = value.encode() if isinstance(value, str) else value
                out[(collection, key)] = Slot(
                    data, None if position == NONE else position, applied if data is not None else 0
                )
        return out

    def record(self, commit: Commit) -> None:
        """Produce the unit's records and wait for every acknowledgement; the ledger record
        that will commit them."""
        self.outgoing()
        writer, store = self.writer, self.store
        track = writer.materializer is not None
        sending = _Deliveries(store.producer(), store.timeout, self.what)
        generation = (GENERATION_HEADER, writer.generation.encode())
        batch = (BATCH_HEADER, str(self.batch.batch_id).encode())
        number = 0
        for collection, out in self._outgoing.items():
            topic = writer.topics[collection]
            positions = out.positions.tolist()
            for key, value, position, applied in zip(
                out.keys, out.values, positions, out.applied.tolist(), strict=True
            ):
                headers: list[tuple[str, Any]] = []
                if position != NONE:
                    headers.append((POSITION_HEADER, str(position)))
                if value is not None:
                    headers.append((APPLIED_HEADER, str(applied)))
                headers += (generation, batch)
                sending.send(topic, key, value, headers, number if track else None)
                number += 1
        delivered = sending.wait()
        number = 0
        for collection, out in self._outgoing.items():
            size = len(out.keys)
            placed = np.full((size, 2), -1, dtype=np.int64)
            for i in range(size) if track else ():
                placed[i] = sending.placed.get(number + i, (-1, -1))
            self._placed[collection] = placed
            number += size
        record = self._record
        assert record is not None
        try:
            bounds, holes = record.advanced(delivered)
        except ValueError as exc:
            raise StoreError(
                f"{self.what}: the output topics changed under the ledger ({exc});"
                " were they deleted and created again?"
            ) from exc
        skipped = hole_size(holes) - hole_size(record.holes)
        if skipped:
            log.info(
                "%s: %d record(s) past the ledger's bounds were never committed (a writer"
                " stopped before its commit, or a stale one); readers skip them",
                self.what,
                skipped,
            )
        self._new = GenerationRecord(
            writer.generation, commit.batch_id, commit.offsets, commit.batches, bounds, holes
        )

    def commit(self) -> None:
        writer, state, new = self.writer, self._state, self._new
        assert state is not None and new is not None
        writer.commit_record(new, self.what)
        for collection, out in self._outgoing.items():
            placed = self._placed[collection]
            lookups = bool(self.store.collection(collection).lookups)
            state.fold(
                collection,
                Folded(
                    pa.array(out.keys, pa.string()),
                    out.positions,
                    out.applied,
                    out.states(),
                    placed[:, 0].astype(np.int32),
                    placed[:, 1],
                    out.values if lookups else None,
                ),
            )
            if writer.materializer is not None:
                for key, value, where in zip(out.keys, out.values, placed.tolist(), strict=True):
                    if value is not None:
                        data = value.encode() if isinstance(value, str) else value
                        writer._cache.put((collection, key), (where[0], where[1]), data)
        writer._known = new
