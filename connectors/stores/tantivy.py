"""The tantivy view store: one full-text index per generation, the ledger inside the index.

Layout: ``<root>/<slug(view)>/<generation>/`` holds one tantivy index per generation;
``<root>/<slug(view)>/live`` is a symlink to the live generation's folder name. A swap points a
fresh symlink at the new folder and renames it over ``live`` (atomic for readers), then deletes
the old folder (a searcher already open on it keeps working). Folders whose names start with a
dot are work in progress (``.tmp-*`` being built, ``.retired-*`` being deleted, ``.live-*`` a
link about to replace ``live``) and never a generation.

Documents (the schema is fixed per store):

- an *entry* per key: ``_uid`` (``entry`` + collection + key, the term a replace deletes by),
  ``_collection``, ``_key``, ``_position``, ``_applied``, ``_fields`` (the exact JSON of the
  fields, stored only), ``lk_<field>`` per lookup (for ``find``) and the declared search fields;
- a *tombstone* per deleted key (``_uid`` with the ``tomb`` prefix, ``_position``), so an old
  insert cannot bring the key back;
- one *ledger* document, the last batch applied and the offsets it reached.

A batch is one commit: tantivy commits are atomic, so the ledger document and the data change
together or not at all (a process killed before the commit leaves the previous commit whole).
Each generation has one ``IndexWriter`` per store object, kept open across batches and shared by
the store's writers of that generation (tantivy allows one writer per index, across processes).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import tantivy

from connectors.errors import StaleGenerationError, StoreError
from connectors.stores.compare import entry_digest
from connectors.stores.protocol import BatchUnit, BatchWriter, named
from connectors.stores.writes import NONE, WriteColumns, entry_objects, guard
from tributary.view_model import (
    Applied,
    Batch,
    Commit,
    Entry,
    Put,
    Rejected,
    fields_json,
)
from tributary.view_model import lookup_text as json_lookup_text
from tributary.view_store import Collection, CommitHooks, Materializer

if TYPE_CHECKING:  # the writer's, with its first batch: not for a store's readers
    import numpy as np

LIVE = "live"

UID = "_uid"
COLLECTION = "_collection"
KEY = "_key"
KIND = "_kind"
POSITION = "_position"
APPLIED = "_applied"
FIELDS = "_fields"
LOOKUP_PREFIX = "lk_"

ENTRY = "entry"
TOMB = "tomb"
LEDGER = "ledger"
LEDGER_UID = "ledger"  # no separator: never the uid of an entry or a tombstone

WRITER_HEAP = 64_000_000  # bytes of indexing memory of a writer (tantivy needs >= 15 MB)
_UID_CHUNK = 512  # uids per term-set query when a batch loads the stored state of its keys
_GENERATION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
_SEP = "\x1f"

T = TypeVar("T")


@dataclass(frozen=True)
class SearchField:
    """A field of the entries that :meth:`TantivyStore.search` can rank by.

    ``text``: tokenized with ``tokenizer`` and stored; ``keyword``: the exact value (raw
    tokenizer); ``date``: an ISO-8601 string or a datetime (naive: UTC); ``integer``: an i64.
    A value of another type is refused: the write goes to ``on_rejected``.
    """

    name: str
    kind: Literal["text", "keyword", "date", "integer"] = "text"
    tokenizer: str = "en_stem"


# -- pure helpers ---------------------------------------------------------------------------


def slug(name: str) -> str:
    """A name safe as a folder name (``mirror.public.users`` -> ``mirror_public_users``)."""
    return re.sub(r"[^a-z0-9_]", "_", name.lower())


def uid(kind: str, collection: str, key: str) -> str:
    """The term an entry (or a tombstone) of ``key`` is replaced and deleted by."""
    return f"{kind}{_SEP}{collection}{_SEP}{key}"


def lookup_text(value: Any) -> str:
    """The indexed text of a lookup value (what PostgreSQL's ``fields ->> name`` gives). Null
    fields are not indexed; a lookup of null asks for the text ``None``, which finds nothing."""
    text = json_lookup_text(value)
    return "None" if text is None else text


def search_words(text: str) -> str | None:
    """The query text for user input: each word quoted, so no input addresses another field,
    uses an operator or fails to parse (None: no words)."""
    words = re.findall(r"\w+", text)
    if not words:
        return None
    return " ".join(f'"{word}"' for word in words)


def search_value(field: SearchField, value: Any) -> Any:
    """The value tantivy indexes for a search field (ValueError: the type does not fit)."""
    if isinstance(value, list):
        return [search_value(field, v) for v in value]
    if field.kind == "date":
        if isinstance(value, str):
            try:
                return dt.datetime.fromisoformat(value)
            except ValueError:
                raise ValueError(f"field {field.name}: {value!r} is not an ISO-8601 date") from None
        if isinstance(value, dt.datetime):
            return value
        raise ValueError(f"field {field.name}: expected a date, got {type(value).__name__}")
    if field.kind == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"field {field.name}: expected an integer, got {type(value).__name__}")
    if field.kind in ("text", "keyword") and not isinstance(value, str):
        raise ValueError(f"field {field.name}: expected a string, got {type(value).__name__}")
    return value


def build_schema(lookups: Sequence[str], search_fields: Sequence[SearchField]) -> tantivy.Schema:
    """The schema of every generation of a store (the same inputs give the same schema)."""
    builder = tantivy.SchemaBuilder()
    for name in (UID, COLLECTION, KIND):
        builder.add_text_field(name, stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_text_field(KEY, stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_integer_field(POSITION, stored=True, indexed=True)
    builder.add_integer_field(APPLIED, stored=True)
    builder.add_bytes_field(FIELDS, stored=True, indexed=False)
    for lookup in sorted(set(lookups)):
        builder.add_text_field(
            LOOKUP_PREFIX + lookup, stored=False, tokenizer_name="raw", index_option="basic"
        )
    for field in search_fields:
        if field.kind == "text":
            builder.add_text_field(field.name, stored=True, tokenizer_name=field.tokenizer)
        elif field.kind == "keyword":
            builder.add_text_field(field.name, stored=False, tokenizer_name="raw")
        elif field.kind == "date":
            builder.add_date_field(field.name, indexed=True, fast=True)
        elif field.kind == "integer":
            builder.add_integer_field(field.name, indexed=True, fast=True)
        else:
            raise StoreError(f"search field {field.name}: unknown kind {field.kind!r}")
    return builder.build()


def _check_field_name(name: str, what: str) -> None:
    if not name or not tantivy.SchemaBuilder.is_valid_field_name(name):
        raise StoreError(f"{what} {name!r} is not a valid tantivy field name")


@contextmanager
def _tantivy_errors(what: str) -> Iterator[None]:
    """tantivy's ValueError / OSError as a StoreError saying what was being done."""
    try:
        yield
    except (ValueError, OSError, RuntimeError) as exc:
        raise StoreError(f"{what}: {exc}") from exc


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _entry_of(doc: tantivy.Document) -> Entry:
    fields = doc.get_first(FIELDS)
    return Entry(
        str(doc.get_first(COLLECTION)),
        str(doc.get_first(KEY)),
        json.loads(fields) if fields is not None else {},
        int(doc.get_first(POSITION) or 0),
        int(doc.get_first(APPLIED) or 0),
    )


def _all_hits(searcher: tantivy.Searcher, query: tantivy.Query) -> list[tantivy.Document]:
    hits = searcher.search(query, max(1, searcher.num_docs)).hits
    return [searcher.doc(address) for _score, address in hits]


def _must(*queries: tantivy.Query) -> tantivy.Query:
    return tantivy.Query.boolean_query([(tantivy.Occur.Must, q) for q in queries])


def _read_ledger(
    schema: tantivy.Schema, searcher: tantivy.Searcher, view: str, generation: str
) -> Commit:
    hits = searcher.search(tantivy.Query.term_query(schema, UID, LEDGER_UID), 1).hits
    if not hits:
        return Commit.empty(view, generation)
    raw = searcher.doc(hits[0][1]).get_first(FIELDS)
    ledger = json.loads(raw) if raw is not None else {}
    return Commit(
        view,
        generation,
        int(ledger.get("batch_id", -1)),
        dict(ledger.get("offsets") or {}),
        int(ledger.get("batches", 0)),
    )


def _ledger_doc(schema: tantivy.Schema, commit: Commit) -> tantivy.Document:
    payload = {"batch_id": commit.batch_id, "offsets": commit.offsets, "batches": commit.batches}
    return tantivy.Document.from_dict(
        {
            UID: LEDGER_UID,
            KIND: LEDGER,
            FIELDS: json.dumps(payload, separators=(",", ":")).encode(),
        },
        schema,
    )


# -- the store ------------------------------------------------------------------------------


class _WriterSlot:
    """The one IndexWriter a store object keeps for a generation, shared by its writers."""

    def __init__(self, generation: str, folder: Path) -> None:
        self.generation = generation
        self.folder = folder
        self.lock = threading.RLock()
        self.users = 0
        self.index: tantivy.Index | None = None
        self.writer: tantivy.IndexWriter | None = None

    def open(self, store: TantivyStore) -> tuple[tantivy.Index, tantivy.IndexWriter]:
        if self.index is not None and self.writer is not None:
            return self.index, self.writer
        if not self.folder.is_dir():
            raise StoreError(
                f"view {store.view}: generation {self.generation} does not exist ({self.folder})"
            )
        try:
            index = tantivy.Index(store.schema, path=str(self.folder))
        except ValueError as exc:
            raise StoreError(
                f"view {store.view}: generation {self.generation} at {self.folder} has another"
                f" schema (lookups or search fields changed? rebuild the view): {exc}"
            ) from exc
        index.config_reader("manual")
        try:
            writer = index.writer(heap_size=WRITER_HEAP, num_threads=1)
        except ValueError as exc:
            if "LockBusy" in str(exc):
                raise StoreError(
                    f"view {store.view}: generation {self.generation} is being written by"
                    " another writer (is another job running this view?)"
                ) from exc
            raise StoreError(
                f"view {store.view}: cannot open a writer on {self.folder}: {exc}"
            ) from exc
        self.index, self.writer = index, writer
        return index, writer

    def discard(self) -> None:
        """Drop the writer and what it did not commit (the directory lock goes with it)."""
        with self.lock:
            writer, self.writer, self.index = self.writer, None, None
            if writer is not None:
                with suppress(ValueError, RuntimeError):
                    writer.rollback()
                with suppress(ValueError, RuntimeError):
                    writer.wait_merging_threads()  # merges end before the lock goes
            del writer


class TantivyStore:
    """A view's state in tantivy indexes under ``root`` (one per generation)."""

    kind = "tantivy"

    def __init__(
        self,
        root: Path,
        view: str,
        collections: Sequence[Collection],
        materializer: Materializer | None = None,
        search_fields: Sequence[SearchField] = (),
    ) -> None:
        self.root = Path(root)
        self.view = view
        self.materializer = materializer
        self.base = self.root / slug(view)
        self.collections: dict[str, Collection] = {c.name: c for c in collections}
        self.search_fields: dict[str, SearchField] = {}
        for field in search_fields:
            _check_field_name(field.name, "search field")
            if field.name.startswith(("_", LOOKUP_PREFIX)):
                raise StoreError(
                    f"search field {field.name!r}: names starting with _ or {LOOKUP_PREFIX}"
                    " are the store's own"
                )
            if field.name in self.search_fields:
                raise StoreError(f"search field {field.name!r} is declared twice")
            self.search_fields[field.name] = field
        lookups = sorted({lookup for c in collections for lookup in c.lookups})
        for lookup in lookups:
            _check_field_name(LOOKUP_PREFIX + lookup, "lookup")
        self.schema = build_schema(lookups, list(self.search_fields.values()))
        self._lock = threading.Lock()
        self._readers: dict[str, tantivy.Index] = {}
        self._slots: dict[str, _WriterSlot] = {}
        self._live_seen: str | None = None

    # -- naming ------------------------------------------------------------------------

    def folder(self, generation: str) -> Path:
        if generation == LIVE or not _GENERATION.fullmatch(generation):
            raise StoreError(f"view {self.view}: {generation!r} is not a generation name")
        return self.base / generation

    def _collection(self, name: str) -> Collection:
        return named(self.view, self.collections, name)

    def _live_target(self) -> str | None:
        try:
            return os.readlink(self.base / LIVE)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"view {self.view}: {self.base / LIVE} is not a symlink") from exc

    # -- documents -----------------------------------------------------------------------

    def entry_doc(
        self,
        collection: str,
        key: str,
        fields: Mapping[str, Any],
        position: int,
        applied: int,
        text: str | None = None,
    ) -> tantivy.Document:
        """An entry's document (ValueError: a search field's value does not fit its kind);
        ``text``: the fields' exact JSON when known."""
        doc: dict[str, Any] = {
            UID: uid(ENTRY, collection, key),
            COLLECTION: collection,
            KEY: key,
            KIND: ENTRY,
            POSITION: position,
            APPLIED: applied,
            FIELDS: (fields_json(fields) if text is None else text).encode(),
        }
        for lookup in self._collection(collection).lookups:
            value = fields.get(lookup)
            if value is not None:
                doc[LOOKUP_PREFIX + lookup] = lookup_text(value)
        for name, field in self.search_fields.items():
            value = fields.get(name)
            if value is not None:
                doc[name] = search_value(field, value)
        return tantivy.Document.from_dict(doc, self.schema)

    def tomb_doc(self, collection: str, key: str, position: int) -> tantivy.Document:
        return tantivy.Document.from_dict(
            {
                UID: uid(TOMB, collection, key),
                COLLECTION: collection,
                KEY: key,
                KIND: TOMB,
                POSITION: position,
            },
            self.schema,
        )

    # -- generations ---------------------------------------------------------------------

    def live_generation(self) -> str:
        from tributary.view_store import new_generation

        target = self._live_target()
        if target is not None:
            return target
        generation = new_generation()
        self._create(generation)
        try:
            os.symlink(generation, self.base / LIVE)
        except FileExistsError:  # another process made one first: use it
            self._remove(generation)
            target = self._live_target()
            assert target is not None
            return target
        _fsync_dir(self.base)
        return generation

    def _create(self, generation: str) -> None:
        """An empty index with an empty ledger, built aside and renamed into place."""
        folder = self.folder(generation)
        self.base.mkdir(parents=True, exist_ok=True)
        work = self.base / f".tmp-{generation}-{uuid.uuid4().hex[:8]}"
        work.mkdir()
        try:
            with _tantivy_errors(f"view {self.view}: cannot create generation {generation}"):
                index = tantivy.Index(self.schema, path=str(work))
                index.config_reader("manual")
                writer = index.writer(heap_size=WRITER_HEAP, num_threads=1)
                writer.add_document(_ledger_doc(self.schema, Commit.empty(self.view, generation)))
                writer.commit()
                writer.wait_merging_threads()
                del writer, index
            os.rename(work, folder)
            _fsync_dir(self.base)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise

    def _remove(self, generation: str) -> None:
        """Delete a generation's folder (renamed aside first, so the name is free at once)."""
        folder = self.folder(generation)
        if not folder.exists():
            return
        retired = self.base / f".retired-{generation}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(folder, retired)
        except FileNotFoundError:
            return
        shutil.rmtree(retired, ignore_errors=True)

    def _forget(self, generation: str) -> None:
        """Drop this object's writer and reader of a generation about to be deleted."""
        with self._lock:
            slot = self._slots.pop(generation, None)
            self._readers.pop(generation, None)
        if slot is not None:
            slot.discard()

    def committed(self, generation: str) -> Commit:
        return self._read(
            generation,
            lambda index, searcher: _read_ledger(index.schema, searcher, self.view, generation),
            Commit.empty(self.view, generation),
        )

    def writer(
        self, generation: str, *, live: bool, hooks: CommitHooks | None = None
    ) -> TantivyWriter:
        return TantivyWriter(
            self, self._acquire(generation), live=live, hooks=hooks or CommitHooks()
        )

    def _acquire(self, generation: str) -> _WriterSlot:
        folder = self.folder(generation)
        with self._lock:
            slot = self._slots.get(generation)
            if slot is None:
                slot = self._slots[generation] = _WriterSlot(generation, folder)
            slot.users += 1
            return slot

    def _release(self, slot: _WriterSlot) -> None:
        with self._lock:
            slot.users -= 1
            last = slot.users <= 0
            if last and self._slots.get(slot.generation) is slot:
                del self._slots[slot.generation]
        if last:
            slot.discard()

    def prepare(self, generation: str) -> None:
        self.discard(generation)
        self._create(generation)

    def generations(self) -> set[str]:
        try:
            names = os.listdir(self.base)
        except FileNotFoundError:
            return set()
        return {
            n for n in names if n != LIVE and not n.startswith(".") and (self.base / n).is_dir()
        }

    def discard(self, generation: str) -> None:
        self.folder(generation)
        if self._live_target() == generation:
            raise StoreError(f"view {self.view}: generation {generation} is live; not dropped")
        self._forget(generation)
        self._remove(generation)

    def swap_in(self, generation: str) -> str | None:
        folder = self.folder(generation)
        if not folder.is_dir():
            raise StoreError(
                f"view {self.view}: generation {generation} does not exist ({folder}); not swapped"
            )
        previous = self._live_target()
        if previous == generation:
            return previous
        link = self.base / f".live-{uuid.uuid4().hex[:8]}"
        os.symlink(generation, link)
        try:
            os.replace(link, self.base / LIVE)
        except BaseException:
            link.unlink(missing_ok=True)
            raise
        _fsync_dir(self.base)
        if previous is not None and _GENERATION.fullmatch(previous) and previous != LIVE:
            self._forget(previous)
            self._remove(previous)
        return previous

    # -- reads -------------------------------------------------------------------------

    def _reader(self, generation: str) -> tantivy.Index:
        with self._lock:
            index = self._readers.get(generation)
        if index is not None:
            return index
        folder = self.folder(generation)
        if not folder.is_dir():
            raise StoreError(f"view {self.view}: generation {generation} does not exist ({folder})")
        with _tantivy_errors(f"view {self.view}: cannot open generation {generation}"):
            index = tantivy.Index.open(str(folder))
            index.config_reader("manual")
        with self._lock:
            return self._readers.setdefault(generation, index)

    def _snapshot(self, generation: str) -> tuple[tantivy.Index, tantivy.Searcher]:
        """The generation's index and a searcher of its last commit (a consistent snapshot)."""
        index = self._reader(generation)
        try:
            with _tantivy_errors(f"view {self.view}: cannot read generation {generation}"):
                index.reload()
                return index, index.searcher()
        except StoreError:
            with self._lock:
                if self._readers.get(generation) is index:
                    del self._readers[generation]
            raise

    def _read(
        self,
        generation: str | None,
        read: Callable[[tantivy.Index, tantivy.Searcher], T],
        empty: T,
    ) -> T:
        """``read`` on a snapshot of ``generation`` (None: the live one, followed across a swap
        that happens meanwhile; ``empty`` when the view has no live generation yet)."""
        if generation is not None:
            index, searcher = self._snapshot(generation)
            with _tantivy_errors(f"view {self.view}: reading generation {generation} failed"):
                return read(index, searcher)
        for attempt in range(5):
            target = self._live_target()
            if target is None:
                return empty
            with self._lock:
                seen, self._live_seen = self._live_seen, target
                if seen is not None and seen != target:
                    self._readers.pop(seen, None)
            try:
                index, searcher = self._snapshot(target)
            except StoreError:
                if attempt < 4 and self._live_target() != target:
                    continue  # swapped (and the old folder deleted) meanwhile: read the new one
                raise
            with _tantivy_errors(f"view {self.view}: reading generation {target} failed"):
                return read(index, searcher)
        raise AssertionError("unreachable")

    def get(self, collection: str, key: str, generation: str | None = None) -> Entry | None:
        self._collection(collection)

        def read(index: tantivy.Index, searcher: tantivy.Searcher) -> Entry | None:
            query = tantivy.Query.term_query(index.schema, UID, uid(ENTRY, collection, key))
            hits = searcher.search(query, 1).hits
            return _entry_of(searcher.doc(hits[0][1])) if hits else None

        return self._read(generation, read, None)

    def scan(self, collection: str, generation: str | None = None) -> list[Entry]:
        self._collection(collection)

        def read(index: tantivy.Index, searcher: tantivy.Searcher) -> list[Entry]:
            query = _must(
                tantivy.Query.term_query(index.schema, COLLECTION, collection),
                tantivy.Query.term_query(index.schema, KIND, ENTRY),
            )
            entries = [_entry_of(doc) for doc in _all_hits(searcher, query)]
            return sorted(entries, key=lambda e: e.key)

        return self._read(generation, read, [])

    def digests(self, generation: str | None = None) -> Iterator[tuple[str, str, str]]:
        """Every entry document of one searcher (one index commit) digested."""

        def read(index: tantivy.Index, searcher: tantivy.Searcher) -> list[Entry]:
            query = tantivy.Query.term_query(index.schema, KIND, ENTRY)
            return [_entry_of(doc) for doc in _all_hits(searcher, query)]

        none: list[Entry] = []
        entries = self._read(generation, read, none)
        for entry in sorted(entries, key=lambda e: (e.collection, e.key)):
            yield entry.collection, entry.key, entry_digest(entry)

    def search(
        self,
        text: str,
        fields: Sequence[str],
        *,
        collection: str,
        limit: int = 10,
        generation: str | None = None,
    ) -> list[tuple[float, Entry]]:
        """Live entries of ``collection`` whose search ``fields`` hold words of ``text``,
        best first (BM25); ``fields`` empty: every text and keyword search field."""
        self._collection(collection)
        names = list(fields) or [
            f.name for f in self.search_fields.values() if f.kind in ("text", "keyword")
        ]
        unknown = [name for name in names if name not in self.search_fields]
        if unknown:
            raise StoreError(
                f"view {self.view}: {', '.join(unknown)} not among the search fields"
                f" ({', '.join(self.search_fields) or 'none declared'})"
            )
        words = search_words(text)
        if words is None or not names or limit <= 0:
            return []

        def read(index: tantivy.Index, searcher: tantivy.Searcher) -> list[tuple[float, Entry]]:
            parsed, _errors = index.parse_query_lenient(words, default_field_names=names)
            query = _must(
                parsed,
                tantivy.Query.const_score_query(
                    tantivy.Query.term_query(index.schema, COLLECTION, collection), 0.0
                ),
                tantivy.Query.const_score_query(
                    tantivy.Query.term_query(index.schema, KIND, ENTRY), 0.0
                ),
            )
            hits = searcher.search(query, limit).hits
            return [(float(score), _entry_of(searcher.doc(address))) for score, address in hits]

        return self._read(generation, read, [])

    def describe(self) -> str:
        return f"tantivy {self.base}"

    def close(self) -> None:
        with self._lock:
            slots = list(self._slots.values())
            self._slots.clear()
            self._readers.clear()
            self._live_seen = None
        for slot in slots:
            slot.discard()


# -- the writer -----------------------------------------------------------------------------


class TantivyWriter(BatchWriter):
    """Applies batches to one generation of a tantivy view store."""

    def __init__(
        self, store: TantivyStore, slot: _WriterSlot, *, live: bool, hooks: CommitHooks
    ) -> None:
        super().__init__(store.view, store.materializer, slot.generation, live=live, hooks=hooks)
        self.store = store
        self._slot: _WriterSlot | None = slot

    def committed(self) -> Commit:
        return self.store.committed(self.generation)

    def close(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:
            self.store._release(slot)

    def check_live(self) -> None:
        live = self.store._live_target()
        if live != self.generation:
            raise self.stale(live)

    @contextmanager
    def unit(self, batch: Batch) -> Iterator[TantivyUnit]:
        """The generation's writer under its lock, a searcher of the last commit; what the
        unit added is rolled back (the writer dropped) unless it commits."""
        if self._slot is None:  # used after close: take a slot again
            self._slot = self.store._acquire(self.generation)
        slot = self._slot
        failed = f"view {self.view}: batch {batch.batch_id} failed"
        with slot.lock:
            try:
                index, writer = slot.open(self.store)
                with _tantivy_errors(failed):
                    index.reload()
                    searcher = index.searcher()
                yield TantivyUnit(self, writer, searcher, failed)
            except BaseException as exc:
                slot.discard()
                if (
                    isinstance(exc, StoreError)
                    and self.live
                    and not isinstance(exc, StaleGenerationError)
                ):
                    self.check_live()  # the folder went away with a swap: say so
                raise


def _stored_state(
    store: TantivyStore, searcher: tantivy.Searcher, writes: WriteColumns, texts: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str | None]]:
    """Position, count, tombstone position (and, with ``texts``, the fields' JSON) of the
    stored entries of the batch's keys, aligned with its rows; term-set queries by uid."""
    import numpy as np

    n = writes.n
    position = np.full(n, NONE, dtype=np.int64)
    applied = np.zeros(n, dtype=np.int64)
    tomb = np.full(n, NONE, dtype=np.int64)
    out: list[str | None] = [None] * n
    rows: dict[str, int] = {}
    for row, (code, key) in enumerate(
        zip(writes.collection_codes.tolist(), writes.keys, strict=True)
    ):
        rows[uid(ENTRY, writes.collections[code], key)] = row
        rows[uid(TOMB, writes.collections[code], key)] = row
    terms = list(rows)
    for start in range(0, len(terms), _UID_CHUNK):
        chunk = terms[start : start + _UID_CHUNK]
        query = tantivy.Query.term_set_query(store.schema, UID, chunk)
        for _score, address in searcher.search(query, len(chunk)).hits:
            doc = searcher.doc(address)
            row = rows[str(doc.get_first(UID))]
            if doc.get_first(KIND) == TOMB:
                tomb[row] = int(doc.get_first(POSITION) or 0)
                continue
            position[row] = int(doc.get_first(POSITION) or 0)
            applied[row] = int(doc.get_first(APPLIED) or 0)
            if texts:
                raw = doc.get_first(FIELDS)
                out[row] = "{}" if raw is None else bytes(raw).decode()
    return position, applied, tomb, out


class TantivyUnit(BatchUnit):
    """One batch's commit on a tantivy index."""

    def __init__(
        self,
        writer: TantivyWriter,
        index_writer: tantivy.IndexWriter,
        searcher: tantivy.Searcher,
        failed: str,
    ) -> None:
        self.writer = writer
        self.store = writer.store
        self.index_writer = index_writer
        self.searcher = searcher
        self.failed = failed
        self._txn: TantivyTxn | None = None
        self._changes: list[tuple[str, tantivy.Document | None]] = []  # uid -> new doc

    def live_generation(self) -> str | None:
        return self.store._live_target()

    def ledger(self) -> Commit:
        with _tantivy_errors(self.failed):
            return _read_ledger(
                self.store.schema, self.searcher, self.store.view, self.writer.generation
            )

    def write(self, writes: WriteColumns, rejected: list[Rejected], applied: bool) -> list[Applied]:
        import numpy as np

        store = self.store
        for collection in writes.collections:
            store._collection(collection)
        if writes.n == 0:
            return []
        with _tantivy_errors(self.failed):
            position, counts_stored, tomb, texts = _stored_state(
                store, self.searcher, writes, applied
            )
        passed, counts = guard(writes, position, counts_stored, tomb)
        rows = np.flatnonzero(passed)
        entry_texts_, fields, errors = entry_objects(writes, rows)
        if applied:
            self._txn = TantivyTxn(store, self.searcher)
            return self._txn.stage_batch(
                writes,
                rows,
                (position, counts_stored, tomb, texts),
                counts,
                entry_texts_,
                fields,
                errors,
                rejected,
                self.failed,
            )
        keys = writes.column("key", rows)
        for i, row in enumerate(rows.tolist()):
            collection, key = writes.collections[writes.collection_codes[row]], keys[i]
            write_position = int(writes.position[row])
            if writes.deleted[row]:
                if position[row] != NONE:
                    self._changes.append((uid(ENTRY, collection, key), None))
                with _tantivy_errors(self.failed):
                    marker = store.tomb_doc(collection, key, write_position)
                self._changes.append((uid(TOMB, collection, key), marker))
                continue
            reason = errors.get(row)
            text, entry = entry_texts_[i], fields[i]
            if reason is None:
                assert text is not None and entry is not None
                try:
                    doc = store.entry_doc(
                        collection, key, entry, write_position, int(counts[row]), text
                    )
                except ValueError as exc:
                    reason = f"{type(exc).__name__}: {exc}"
            if reason is not None:
                rejected.append(Rejected(writes.write(row), reason))
                continue
            self._changes.append((uid(ENTRY, collection, key), doc))
            if tomb[row] != NONE:
                self._changes.append((uid(TOMB, collection, key), None))
        return []

    def txn(self) -> TantivyTxn:
        if self._txn is None:
            self._txn = TantivyTxn(self.store, self.searcher)
        return self._txn

    def record(self, commit: Commit) -> None:
        changes = self._changes if self._txn is None else self._txn.changes()
        writer = self.index_writer
        with _tantivy_errors(self.failed):
            for term, new in changes:
                writer.delete_documents_by_term(UID, term)
                if new is not None:
                    writer.add_document(new)
            writer.delete_documents_by_term(UID, LEDGER_UID)
            writer.add_document(_ledger_doc(self.store.schema, commit))

    def commit(self) -> None:
        if self.writer.live:
            self.writer.check_live()
        with _tantivy_errors(f"{self.failed} (the batch is retried when the job restarts)"):
            self.index_writer.commit()


# -- the materializer's view of a batch ------------------------------------------------------


@dataclass(frozen=True)
class _Staged:
    """An entry a unit wrote: its fields as JSON, position, count and lookup texts."""

    collection: str
    key: str
    fields: str
    position: int
    applied: int
    lookups: dict[str, str]

    def entry(self) -> Entry:
        return Entry(
            self.collection, self.key, json.loads(self.fields), self.position, self.applied
        )


_Pending = _Staged | None  # None: deleted in this unit


class TantivyTxn:
    """One batch's pending writes over a searcher of the last commit (the
    :class:`~tributary.view_store.StoreTxn` of the tantivy store): reads see the unit's own
    writes first."""

    def __init__(self, store: TantivyStore, searcher: tantivy.Searcher) -> None:
        self.store = store
        self.searcher = searcher
        self._stored: dict[tuple[str, str], Entry | None] = {}
        self._tombs: dict[tuple[str, str], int | None] = {}
        self._pending: dict[tuple[str, str], _Pending] = {}
        # (collection, lookup, text) -> keys staged with it (some since re-staged: re-checked)
        self._staged_with: dict[tuple[str, str, str], set[str]] = {}
        self._docs: dict[str, tantivy.Document | None] = {}  # uid -> new document (None: gone)

    # -- stored state ------------------------------------------------------------------

    def load(self, idents: Sequence[tuple[str, str]]) -> None:
        """Read the stored entries and tombstones of ``idents`` (a batch's keys) at once."""
        todo = [i for i in idents if i not in self._stored]
        for ident in todo:
            self._stored[ident] = None
            self._tombs[ident] = None
        terms = [uid(kind, c, k) for c, k in todo for kind in (ENTRY, TOMB)]
        for start in range(0, len(terms), _UID_CHUNK):
            chunk = terms[start : start + _UID_CHUNK]
            query = tantivy.Query.term_set_query(self.store.schema, UID, chunk)
            for _score, address in self.searcher.search(query, len(chunk)).hits:
                doc = self.searcher.doc(address)
                ident = (str(doc.get_first(COLLECTION)), str(doc.get_first(KEY)))
                if doc.get_first(KIND) == TOMB:
                    self._tombs[ident] = int(doc.get_first(POSITION) or 0)
                else:
                    self._stored[ident] = _entry_of(doc)

    def stage_batch(
        self,
        writes: WriteColumns,
        rows: np.ndarray,
        stored: tuple[np.ndarray, np.ndarray, np.ndarray, list[str | None]],
        counts: np.ndarray,
        texts: list[str | None],
        fields: list[dict[str, Any] | None],
        errors: dict[int, str],
        rejected: list[Rejected],
        failed: str,
    ) -> list[Applied]:
        """Stage the batch's writes that passed the guard (``rows``, with their entries'
        texts and fields); the ones that pass, with their entry's fields before them."""
        position, applied_before, tomb, stored_texts = stored
        keys = writes.keys
        for row in range(writes.n):
            ident = (writes.collections[writes.collection_codes[row]], keys[row])
            text = stored_texts[row]
            self._stored[ident] = (
                None
                if position[row] == NONE or text is None
                else Entry(
                    ident[0],
                    ident[1],
                    json.loads(text),
                    int(position[row]),
                    int(applied_before[row]),
                )
            )
            self._tombs[ident] = None if tomb[row] == NONE else int(tomb[row])
        out: list[Applied] = []
        objects = writes.writes(rows)
        for i, row in enumerate(rows.tolist()):
            write = objects[i]
            ident = (write.collection, write.key)
            entry = self._stored[ident]
            before = None if entry is None else entry.fields
            if isinstance(write, Put):
                reason = errors.get(row)
                count = int(counts[row])
                if reason is None:
                    text, values = texts[i], fields[i]
                    assert text is not None and values is not None
                    try:
                        doc = self.store.entry_doc(
                            write.collection, write.key, values, write.position, count, text
                        )
                    except ValueError as exc:
                        reason = f"{type(exc).__name__}: {exc}"
                if reason is not None:
                    rejected.append(Rejected(write, reason))
                    continue
                self.stage(write.collection, write.key, values, write.position, count, doc, text)
                if tomb[row] != NONE:
                    self.stage_tomb(write.collection, write.key, None)
            else:
                if entry is not None:
                    self.stage(write.collection, write.key, None, 0, 0, None)
                with _tantivy_errors(failed):
                    marker = self.store.tomb_doc(write.collection, write.key, write.position)
                self.stage_tomb(write.collection, write.key, (write.position, marker))
            out.append(Applied(write, before))
        return out

    def entry(self, ident: tuple[str, str]) -> Entry | None:
        """The entry as the unit sees it (its own writes first)."""
        if ident in self._pending:
            pending = self._pending[ident]
            return None if pending is None else pending.entry()
        if ident not in self._stored:
            self.load([ident])
        return self._stored[ident]

    def tomb(self, ident: tuple[str, str]) -> int | None:
        if ident not in self._tombs:
            self.load([ident])
        return self._tombs[ident]

    # -- staging -----------------------------------------------------------------------

    def stage(
        self,
        collection: str,
        key: str,
        fields: Mapping[str, Any] | None,
        position: int,
        applied: int,
        doc: tantivy.Document | None,
        text: str | None = None,
    ) -> None:
        """The entry of ``key`` after this unit (fields None: deleted; ``text``: the fields'
        exact JSON when known)."""
        ident = (collection, key)
        if fields is None:
            self._pending[ident] = None
        else:
            lookups = {
                name: lookup_text(fields[name])
                for name in self.store._collection(collection).lookups
                if fields.get(name) is not None
            }
            self._pending[ident] = _Staged(
                collection,
                key,
                fields_json(fields) if text is None else text,
                position,
                applied,
                lookups,
            )
            for name, looked in lookups.items():
                if looked is not None:
                    self._staged_with.setdefault((collection, name, looked), set()).add(key)
        self._docs[uid(ENTRY, collection, key)] = doc

    def stage_tomb(
        self, collection: str, key: str, tomb: tuple[int, tantivy.Document] | None
    ) -> None:
        self._tombs[(collection, key)] = None if tomb is None else tomb[0]
        self._docs[uid(TOMB, collection, key)] = None if tomb is None else tomb[1]

    def changes(self) -> list[tuple[str, tantivy.Document | None]]:
        """Every uid the unit replaces or deletes, with its new document (None: deleted)."""
        return list(self._docs.items())

    # -- StoreTxn --------------------------------------------------------------------------

    def get(self, collection: str, key: str) -> Entry | None:
        self.store._collection(collection)
        return self.entry((collection, key))

    def count(self, collection: str, field: str, value: Any) -> int:
        return len(self.find(collection, field, value))

    def find(self, collection: str, field: str, value: Any) -> list[Entry]:
        if field not in self.store._collection(collection).lookups:
            raise StoreError(
                f"view {self.store.view}: {field} is not a lookup of {collection}"
                " (declare it in the collection's lookups)"
            )
        text = lookup_text(value)
        schema = self.store.schema
        query = _must(
            tantivy.Query.term_query(schema, LOOKUP_PREFIX + field, text),
            tantivy.Query.term_query(schema, COLLECTION, collection),
            tantivy.Query.term_query(schema, KIND, ENTRY),
        )
        with _tantivy_errors(f"view {self.store.view}: find {collection}.{field} failed"):
            docs = _all_hits(self.searcher, query)
        found: dict[str, Entry] = {}
        for doc in docs:
            key = str(doc.get_first(KEY))
            if (collection, key) not in self._pending:
                found[key] = _entry_of(doc)
        staged = () if text is None else self._staged_with.get((collection, field, text), ())
        for key in staged:
            pending = self._pending[(collection, key)]
            if pending is not None and pending.lookups.get(field) == text:
                found[key] = pending.entry()
        return [found[key] for key in sorted(found)]

    def put(self, collection: str, key: str, fields: Mapping[str, Any]) -> None:
        existing = self.get(collection, key)
        position, applied = (0, 0) if existing is None else (existing.position, existing.applied)
        try:
            doc = self.store.entry_doc(collection, key, fields, position, applied)
        except ValueError as exc:
            raise StoreError(
                f"view {self.store.view}: the materializer's write to {collection}/{key} does"
                f" not fit the index: {exc}"
            ) from exc
        self.stage(collection, key, fields, position, applied, doc)

    def delete(self, collection: str, key: str) -> None:
        self.store._collection(collection)
        self.stage(collection, key, None, 0, 0, None)
