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

The records' and the ledger's formats, and the reads and produces of these topics, are in
:mod:`connectors.stores.kafka_ledger`.
"""

import json
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, Message, Producer

from connectors.errors import (
    KafkaError,
    StoreError,
    StoreUnavailableError,
)
from connectors.kafka.admin import TopicAdmin, error_code
from connectors.kafka.config import ClientValue, KafkaConfig
from connectors.kafka.topics import history_topic, state_topic
from connectors.stores.compare import entry_digest
from connectors.stores.kafka_ledger import (
    LIVE,
    MAX_MESSAGE_BYTES,
    SEP,
    Deliveries,
    GenerationRecord,
    LedgerLog,
    PartitionRef,
    Range,
    RangeReader,
    Slot,
    in_ranges,
    ledger_key,
    read_ranges,
)
from connectors.stores.kafka_writer import KafkaWriter
from connectors.stores.protocol import named
from tributary.view_model import (
    Commit,
    Entry,
)
from tributary.view_store import Collection, CommitHooks, Materializer, new_generation

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


def record_headers(msg: Message) -> list[tuple[str, Any]]:
    raw = msg.headers()
    if raw is None:
        return []
    return list(raw.items()) if isinstance(raw, dict) else list(raw)


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
        self.lock = threading.RLock()  # the reading consumer, the ledger, the admin client
        self._changing = threading.RLock()  # one change of generations at a time
        self._ledger: LedgerLog | None = None
        self._producer: Producer | None = None
        self._admin: TopicAdmin | None = None
        self._ready: set[str] = set()  # topics known to exist with the right settings
        self._checked: set[str] = set()  # topics whose partition count matches

    # -- naming ----------------------------------------------------------------------

    def collection(self, name: str) -> Collection:
        return named(self.view, self.collections, name)

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

    # -- clients (the consumer and the ledger under lock) ----------------------------------

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

    def reader(self) -> RangeReader:
        """The reader of every read (the ledger's: one per store object)."""
        return self.ledger().reader

    def producer(self) -> Producer:
        """The store's idempotent producer, shared by its writers (starting one takes
        half a second on some brokers)."""
        with self.lock:
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
        with self.lock:
            self.ledger().note(name, record, offset)

    def current(self) -> LedgerLog:
        """The ledger read up to its end now (call under lock)."""
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
        ledger = self.current()
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
            with self.lock:
                live = self.current().live()
            if live is not None:
                return live.generation
            with self._changing:
                with self.lock:
                    live = self.current().live()
                    if live is not None:
                        return live.generation
                    self.ensure_topics(self.generation_topics(None).values())
                record = GenerationRecord(new_generation())
                self._put_record(LIVE, record, "creating the live generation")
                with self.lock:  # another process may have created one too: the latest wins
                    live = self.current().live()
        if live is None:
            raise StoreError(f"view {self.view}: the live record vanished from the ledger")
        return live.generation

    def committed(self, generation: str) -> Commit:
        with self.lock, self.errors("reading the ledger"):
            ledger = self.current()
        live = ledger.live()
        if live is not None and live.generation == generation:
            return live.commit(self.view)
        shadow = ledger.shadow(generation)
        if shadow is not None:
            return shadow.commit(self.view)
        return Commit.empty(self.view, generation)

    def writer(
        self, generation: str, *, live: bool, hooks: CommitHooks | None = None
    ) -> KafkaWriter:
        return KafkaWriter(self, generation, live=live, hooks=hooks or CommitHooks())

    def prepare(self, generation: str) -> None:
        self._check_generation(generation)
        with self._changing:
            self.discard(generation)
            with self.errors("preparing a generation"):
                with self.lock:
                    self.ensure_topics(self.generation_topics(generation).values())
                record = GenerationRecord(generation)
                self._put_record(generation, record, "preparing a generation")

    def generations(self) -> set[str]:
        with self.lock, self.errors("listing generations"):
            ledger = self.current()
            found = set(ledger.shadows())
            live = ledger.live()
        if live is not None:
            found.add(live.generation)
        return found

    def discard(self, generation: str) -> None:
        with self._changing, self.errors("discarding a generation"):
            with self.lock:
                ledger = self.current()
                live, shadow = ledger.live(), ledger.shadow(generation)
            if live is not None and live.generation == generation:
                raise StoreError(f"view {self.view}: generation {generation} is live; not dropped")
            if shadow is not None:
                self._put_record(generation, None, "discarding a generation")
            if generation != LIVE:
                self._drop_topics(generation)

    def _drop_topics(self, generation: str) -> None:
        shadow = set(self.generation_topics(generation).values())
        with self.lock:
            existing = shadow & set(self.admin().topic_names())
            self._ready.difference_update(shadow)
            self._checked.difference_update(shadow)
            self.admin().delete(*sorted(existing))

    def swap_in(self, generation: str) -> str | None:
        with self._changing, self.errors("swapping generations"):
            live_topics = self.generation_topics(None)
            with self.lock:
                ledger = self.current()
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
                new = self.read_slots(self.reader(), shadow, self.generation_topics(generation))
                old = self.read_slots(self.reader(), base, live_topics)
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
        with self.lock, self.errors("reading an entry"):
            record, shadow = self._resolve(generation)
            if record is None:
                return None
            topic = self.topic(collection, shadow)
            self._check_partitions(topic)
            partition = partition_for(key.encode(), self.partitions)
            slots = self.read_slots(
                self.reader(), record, {collection: topic}, only={collection: partition}
            )
        slot = slots[collection].get(key)
        return None if slot is None else _entry(collection, key, slot)

    def scan(self, collection: str, generation: str | None = None) -> list[Entry]:
        self.collection(collection)
        with self.lock, self.errors("scanning a collection"):
            record, shadow = self._resolve(generation)
            if record is None:
                return []
            slots = self.read_slots(
                self.reader(), record, {collection: self.topic(collection, shadow)}
            )
        out = [_entry(collection, key, slot) for key, slot in sorted(slots[collection].items())]
        return [e for e in out if e is not None]

    def digests(self, generation: str | None = None) -> Iterator[tuple[str, str, str]]:
        """Every collection's topic read up to the bounds of one ledger record, digested."""
        with self.lock, self.errors("listing a generation"):
            record, shadow = self._resolve(generation)
            if record is None:
                return
            topics = {c: self.topic(c, shadow) for c in self.collections}
            slots = self.read_slots(self.reader(), record, topics)
        for collection in sorted(slots):
            for key, slot in sorted(slots[collection].items()):
                entry = _entry(collection, key, slot)
                if entry is not None:
                    yield collection, key, entry_digest(entry)

    def describe(self) -> str:
        if self.configured:
            where = " ".join(self.topics[c] for c in self.collections)
        else:
            where = f"views.{self.view}.*"
        return f"kafka {self.kafka.bootstrap_servers} {where}"

    def close(self) -> None:
        with self._changing, self.lock:
            if self._ledger is not None:
                self._ledger.close()
                self._ledger = None
            if self._producer is not None:
                self._producer.flush(self.timeout)
                self._producer = None
