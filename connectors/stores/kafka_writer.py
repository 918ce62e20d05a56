"""The Kafka store's writer: the protocol's unit on Kafka, and what a writer remembers.

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
"""

import json
import logging
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from confluent_kafka import Message

from connectors.errors import StoreError
from connectors.stores.kafka_ledger import (
    APPLIED_HEADER,
    BATCH_HEADER,
    GENERATION_HEADER,
    LIVE,
    MAX_MESSAGE_BYTES,
    POSITION_HEADER,
    RECORD_OVERHEAD,
    Deliveries,
    GenerationRecord,
    Ident,
    LedgerLog,
    PartitionRef,
    Range,
    Slot,
    hole_size,
    iter_ranges,
    ledger_key,
    read_offsets,
)
from connectors.stores.kafka_types import WriterStore
from connectors.stores.positions import ENTRY, GONE, NONE, TOMB, PositionIndex
from connectors.stores.protocol import BatchUnit, BatchWriter
from connectors.stores.writes import Staged, WriteColumns, entry_texts, guard
from tributary.view_model import (
    Applied,
    Batch,
    Commit,
    Entry,
    JsonObject,
    Put,
    Rejected,
    lookup_text,
)
from tributary.view_store import Collection, CommitHooks

log = logging.getLogger(__name__)

# -- the writer's state and the materializer's transaction -------------------------------


class _State(Staged):
    """A pending entry of a unit, and its slot in the unit's topic writes."""

    def slot(self) -> Slot:
        return Slot(self.text.encode(), self.position, self.applied)


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
    :class:`~tributary.view_store.StoreTxn` of the Kafka store): reads see the unit's pending
    writes first, then the committed state (an entry's fields read from its record, or the
    writer's cache); nothing reaches Kafka until the writer produces :meth:`changes`."""

    def __init__(self, store: WriterStore, writer: "KafkaWriter", state: WriterState) -> None:
        self.store = store
        self.writer = writer
        self.state = state
        self._committed: dict[Ident, Slot] = {}
        self._pending: dict[Ident, _State | None] = {}  # None: deleted in this unit
        self._tombs: dict[Ident, int | None] = {}  # positions of deleted keys (None: cleared)
        # (collection, lookup) -> text -> keys pending with it, made at the first find of the
        # lookup and kept up by put (keys put again since are re-checked by find)
        self._pending_with: dict[tuple[str, str], dict[str, set[str]]] = {}

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
        text = slot.value.decode()
        return _State(JsonObject(text), text, slot.position or 0, slot.applied)

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
        self._pending_with.clear()  # made again from the staged entries at the next find
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
                    JsonObject(text), text, write.position, int(counts[row])
                )
                self._tombs[ident] = None
            else:
                self._pending[ident] = None
                self._tombs[ident] = write.position
            before = None if stored.value is None else JsonObject(stored.value.decode())
            applied.append(Applied(write, before))
        return applied

    # -- StoreTxn ------------------------------------------------------------------------

    def get(self, collection: str, key: str) -> Entry | None:
        self.store.collection(collection)
        state = self._current((collection, key))
        return None if state is None else state.entry(collection, key)

    def count(self, collection: str, field: str, value: Any) -> int:
        return len(self.find(collection, field, value))

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
        keys.update(self._pending_index(collection, field).get(wanted, ()))
        self.committed([(collection, k) for k in keys])
        out: list[Entry] = []
        for key in sorted(keys):
            state = self._current((collection, key))
            if state is not None and lookup_text(state.fields.get(field)) == wanted:
                out.append(state.entry(collection, key))
        return out

    def _pending_index(self, collection: str, field: str) -> dict[str, set[str]]:
        """The keys this unit holds pending entries for, by their ``field``'s lookup text."""
        index = self._pending_with.get((collection, field))
        if index is None:
            index = {}
            for (c, key), state in self._pending.items():
                if c == collection and state is not None:
                    self._index(index, key, state, field)
            self._pending_with[(collection, field)] = index
        return index

    @staticmethod
    def _index(index: dict[str, set[str]], key: str, state: _State, field: str) -> None:
        text = lookup_text(state.fields.get(field))
        if text is not None:
            index.setdefault(text, set()).add(key)

    def put(self, collection: str, key: str, fields: Mapping[str, Any]) -> None:
        self.store.collection(collection)
        ident = (collection, key)
        current = self._current(ident)
        position, applied = (0, 0) if current is None else (current.position, current.applied)
        try:
            state = _State.of(fields, position, applied)
        except (TypeError, ValueError) as exc:
            raise StoreError(
                f"view {self.store.view}: derived write {collection}/{key}: {exc}"
            ) from exc
        self._pending[ident] = state
        for (c, field), index in self._pending_with.items():
            if c == collection:
                self._index(index, key, state, field)

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
        self, store: WriterStore, generation: str, *, live: bool, hooks: CommitHooks
    ) -> None:
        super().__init__(store.view, store.materializer, generation, live=live, hooks=hooks)
        self.store = store
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
        reader = store.reader()
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
                wanted = {(topic, partition): (0, end)}
                for batch in iter_ranges(reader, wanted, store.timeout, what):
                    chunk.add(batch)
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
        with store.lock:
            found = read_offsets(
                store.reader(), missing, store.timeout, f"view {store.view}: reading entries"
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
        committing = Deliveries(store.producer(), store.timeout, f"{what}: commit")
        key = ledger_key(store.view, self.shadow)
        committing.send(store.ledger_topic, key.encode(), record.to_json(), [])
        [offset] = committing.wait()[(store.ledger_topic, 0)]
        with store.lock:
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

    def add(self, batch: Sequence[Message]) -> None:
        """Collect a fetched batch of records (keyless ones are not the store's)."""
        keys, offsets, positions = self.keys, self.offsets, self.positions
        applied_counts, states, values = self.applied, self.states, self.values
        lookups = self.lookups
        for msg in batch:
            key = msg.key()
            if key is None:
                continue
            value = msg.value()
            position: int | None = None
            applied = 0
            headers = msg.headers() or ()
            if isinstance(headers, dict):
                headers = list(headers.items())
            for name, raw in headers:
                if raw is None:
                    continue
                if name == POSITION_HEADER:
                    position = int(raw)
                elif name == APPLIED_HEADER:
                    applied = int(raw)
            if value is not None:
                states.append(ENTRY)
                positions.append(0 if position is None else position)
            else:
                states.append(GONE if position is None else TOMB)
                positions.append(NONE if position is None else position)
            keys.append(key)
            offsets.append(msg.offset() or 0)
            applied_counts.append(applied)
            if lookups:
                values.append(value)

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
        with self.store.lock:
            self._ledger = self.store.current()
            live = self._ledger.live()
        return None if live is None else live.generation

    def ledger(self) -> Commit:
        with self.store.lock:
            if self._ledger is None:
                self._ledger = self.store.current()
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
        for i in np.flatnonzero(sizes + RECORD_OVERHEAD > MAX_MESSAGE_BYTES).tolist():
            if texts[i] is not None:
                size = int(sizes[i]) + RECORD_OVERHEAD
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
        sending = Deliveries(store.producer(), store.timeout, self.what)
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
