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

A writer (one per generation, :mod:`connectors.stores.kafka_writer`) produces a batch's
changed entries past the ledger's bounds, waits for every acknowledgement, then produces the
ledger record - the commit. The new bound of a partition is the offset after the last record
delivered; every offset between the old bound and it that is not one of this writer's records
is a hole (records of a writer that crashed before its ledger record, or of a stale writer). A
process killed before the ledger record leaves records past the bound, which readers never see
and the next writer turns into holes.

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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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
    Commit,
    Entry,
    Offsets,
)

if TYPE_CHECKING:
    from connectors.stores.kafka_writer import KafkaWriter

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


def record_headers(msg: Message) -> list[tuple[str, Any]]:
    raw = msg.headers()
    if raw is None:
        return []
    return list(raw.items()) if isinstance(raw, dict) else list(raw)


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

    def _send(self, what: str) -> Deliveries:
        return Deliveries(self.producer(), self.timeout, f"view {self.view}: {what}")

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
                    slot = Slot.of(msg.value(), record_headers(msg))
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
        from connectors.stores.kafka_writer import KafkaWriter

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
