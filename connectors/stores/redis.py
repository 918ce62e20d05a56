"""The Redis view store: one hash per entry, the ledger in the same MULTI/EXEC.

Names (``v`` the view, ``c`` a collection, ``k`` a key, ``g`` a generation):

- an entry lives in a hash at its *logical name* ``tributary:v:c:k``, or at the collection's
  public format (``key_format={"profiles": "profile:{key}"}`` puts it at ``profile:42``, which
  services read with a plain HGETALL). The hash holds every field rendered for humans (str as
  is, numbers as decimal text, bools as ``true``/``false``, lists and dicts as compact JSON,
  None left out) plus ``_position``, ``_applied`` and ``_json``, the exact JSON of the fields;
- tombstones of deleted keys: hash ``tributary:v:tombs:c`` (field = key, value = position);
- lookup indexes: set ``tributary:v:idx:c:field:value`` of the keys whose field has the value;
- the live generation uses logical names as they are; a shadow generation ``g`` prefixes every
  logical name with ``tributary:v@g:``;
- bookkeeping, named with the generation rather than prefixed: ledger hash
  ``tributary:v:ledger:g`` (``batch_id``, ``offsets`` as JSON, ``batches``), members set
  ``tributary:v:members:g`` (every logical name the generation wrote: swap, discard and scan
  walk it) and the live pointer ``tributary:v:live``.

One batch is one MULTI/EXEC (the unit of :class:`~connectors.stores.protocol.BatchWriter`,
which runs the protocol): WATCH the generation's ledger and the live pointer, read the ledger,
read the stored positions, counts and tombstones of the batch's keys (one script call per
collection, in one round trip), apply the position guard over the columns, run the
materializer on an overlay of the unit's pending writes (only a store with one builds a Python
object per write), then queue the entries (one script call: DEL + HSET per entry), the index,
tombstone and members updates and the ledger update, and EXEC. Nothing reaches Redis before
EXEC, so a writer killed before it leaves neither data nor ledger. Reads (``get``, ``scan``)
and ``swap_in`` / ``discard`` are Lua scripts, so a reader sees a generation before or after a
swap, never half.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from connectors.errors import StoreError, StoreUnavailableError
from connectors.stores.compare import scan_digests
from connectors.stores.protocol import BatchUnit, BatchWriter, named
from connectors.stores.writes import NONE, Staged, WriteColumns, entry_objects, guard
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
from tributary.view_store import Collection, CommitHooks, Materializer, new_generation

if TYPE_CHECKING:
    import numpy as np  # the writer's, with its first batch: not for a store's readers
    import redis  # with the first request: the store is defined without it
    from redis.commands.core import Script
    from redis.typing import EncodableT, FieldT

log = logging.getLogger(__name__)

POSITION = "_position"
APPLIED = "_applied"
JSON = "_json"
_META = (JSON, POSITION, APPLIED)
_SCHEMES = ("redis", "rediss", "unix")  # what redis-py's URLs may start with

Ident = tuple[str, str]  # (collection, key)

# -- names ------------------------------------------------------------------------------


def render(value: Any) -> str | None:
    """A field value as a hash field (and index value) shows it; None: the field is left out.
    A scalar as a lookup compares it (:func:`lookup_text`), anything else as compact JSON."""
    if value is None or isinstance(value, str | int | float):  # (bool is an int)
        return lookup_text(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def glob_escape(text: str) -> str:
    """``text`` as a literal inside a Redis glob pattern (SCAN MATCH)."""
    return "".join("\\" + ch if ch in "*?[]\\^" else ch for ch in text)


Pattern = tuple[str, str]  # (prefix, suffix): the names ``prefix + key + suffix``


def matches(pattern: Pattern, name: str) -> bool:
    prefix, suffix = pattern
    return (
        len(name) >= len(prefix) + len(suffix) and name.startswith(prefix) and name.endswith(suffix)
    )


def overlap(a: Pattern, b: Pattern) -> bool:
    """Whether some name fits both patterns (one prefix extends the other, and so do the
    suffixes: a long enough key then fits both)."""
    (pa, sa), (pb, sb) = a, b
    return (pa.startswith(pb) or pb.startswith(pa)) and (sa.endswith(sb) or sb.endswith(sa))


@dataclass(frozen=True)
class KeyNames:
    """The Redis key names of one view (pure: no connection)."""

    view: str
    patterns: Mapping[str, Pattern]  # collection -> where its entries live (logical names)

    @classmethod
    def build(
        cls, view: str, collections: Iterable[str], key_format: Mapping[str, str] | None = None
    ) -> KeyNames:
        """Names of ``view``'s collections; refuses names that could be read two ways."""
        if not view or ":" in view or "@" in view:
            raise StoreError(f"view name {view!r} must be non-empty, without ':' or '@' (Redis)")
        names = list(collections)
        formats = dict(key_format or {})
        unknown = sorted(set(formats) - set(names))
        if unknown:
            raise StoreError(f"view {view}: key_format names unknown collections {unknown}")
        patterns: dict[str, Pattern] = {}
        for collection in names:
            fmt = formats.get(collection)
            if fmt is None:
                patterns[collection] = (f"tributary:{view}:{collection}:", "")
                continue
            if fmt.count("{key}") != 1:
                raise StoreError(
                    f"view {view}: key_format of {collection} must hold {{key}} once, got {fmt!r}"
                )
            prefix, suffix = fmt.split("{key}")
            patterns[collection] = (prefix, suffix)
        out = cls(view, patterns)
        out._check(names)
        return out

    def _check(self, collections: Sequence[str]) -> None:
        root = f"tributary:{self.view}"
        reserved: list[tuple[str, Pattern]] = [
            ("tombstones", (f"{root}:tombs:", "")),
            ("indexes", (f"{root}:idx:", "")),
            ("ledgers", (f"{root}:ledger:", "")),
            ("members sets", (f"{root}:members:", "")),
            ("shadow generations", (f"{root}@", "")),
        ]
        for i, collection in enumerate(collections):
            mine = self.patterns[collection]
            if matches(mine, self.live):
                raise StoreError(f"view {self.view}: {collection} entries could be {self.live}")
            for what, pattern in reserved:
                if overlap(mine, pattern):
                    raise StoreError(
                        f"view {self.view}: names of collection {collection} ({mine[0]}{{key}}"
                        f"{mine[1]}) collide with the view's {what} ({pattern[0]}...)"
                    )
            for other in collections[i + 1 :]:
                if overlap(mine, self.patterns[other]):
                    raise StoreError(
                        f"view {self.view}: collections {collection} and {other} have names"
                        " that could be the same key"
                    )

    @property
    def root(self) -> str:
        return f"tributary:{self.view}"

    @property
    def live(self) -> str:
        return f"{self.root}:live"

    @property
    def shadow_base(self) -> str:
        """A shadow generation's prefix without the generation and its colon."""
        return f"{self.root}@"

    def shadow_prefix(self, generation: str) -> str:
        return f"{self.shadow_base}{generation}:"

    def physical(self, name: str, shadow: str | None) -> str:
        """Where a logical name lives in a generation (None: the live one)."""
        return name if shadow is None else self.shadow_prefix(shadow) + name

    @property
    def ledger_base(self) -> str:
        return f"{self.root}:ledger:"

    def ledger(self, generation: str) -> str:
        return self.ledger_base + generation

    @property
    def members_base(self) -> str:
        return f"{self.root}:members:"

    def members(self, generation: str) -> str:
        return self.members_base + generation

    def pattern(self, collection: str) -> Pattern:
        return self.patterns[collection]

    def entry(self, collection: str, key: str) -> str:
        prefix, suffix = self.patterns[collection]
        return prefix + key + suffix

    def key_of(self, collection: str, name: str) -> str | None:
        """The key of a logical entry name of ``collection`` (None: not one of its names)."""
        pattern = self.patterns[collection]
        if not matches(pattern, name):
            return None
        prefix, suffix = pattern
        return name[len(prefix) : len(name) - len(suffix)]

    def tombs(self, collection: str) -> str:
        return f"{self.root}:tombs:{collection}"

    def index(self, collection: str, field: str, value: str) -> str:
        return f"{self.root}:idx:{collection}:{field}:{value}"


# -- scripts ----------------------------------------------------------------------------

# Every script gets the live pointer as KEYS[1]; a generation argument '' means the live one.

_GET = """
local live = redis.call('GET', KEYS[1])
local gen = ARGV[1]
if gen == '' then
  if not live then return false end
  gen = live
end
local target = ARGV[3]
if gen ~= live then target = ARGV[2] .. gen .. ':' .. target end
return redis.call('HMGET', target, '_json', '_position', '_applied')
"""

_SCAN = """
local live = redis.call('GET', KEYS[1])
local gen = ARGV[1]
if gen == '' then
  if not live then return {} end
  gen = live
end
local phys = ''
if gen ~= live then phys = ARGV[2] .. gen .. ':' end
local prefix, suffix = ARGV[4], ARGV[5]
local out = {}
for _, name in ipairs(redis.call('SMEMBERS', ARGV[3] .. gen)) do
  if #name >= #prefix + #suffix and string.sub(name, 1, #prefix) == prefix
      and string.sub(name, #name - #suffix + 1) == suffix then
    local target = phys .. name
    if redis.call('TYPE', target)['ok'] == 'hash' then
      local v = redis.call('HMGET', target, '_json', '_position', '_applied')
      if v[1] and v[2] and v[3] then
        out[#out + 1] = name
        out[#out + 1] = v[1]
        out[#out + 1] = v[2]
        out[#out + 1] = v[3]
      end
    end
  end
end
return out
"""

_SWAP = """
local gen = ARGV[1]
local previous = redis.call('GET', KEYS[1])
if previous == gen then return {'same', gen} end
if redis.call('EXISTS', ARGV[4] .. gen) == 0 then return {'unknown'} end
if previous then
  for _, name in ipairs(redis.call('SMEMBERS', ARGV[3] .. previous)) do
    redis.call('DEL', name)
  end
  redis.call('DEL', ARGV[3] .. previous, ARGV[4] .. previous)
end
local prefix = ARGV[2] .. gen .. ':'
for _, name in ipairs(redis.call('SMEMBERS', ARGV[3] .. gen)) do
  if redis.call('EXISTS', prefix .. name) == 1 then
    redis.call('RENAME', prefix .. name, name)
  end
end
redis.call('SET', KEYS[1], gen)
if previous then return {'swapped', previous} end
return {'swapped'}
"""

_DISCARD = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return 0 end
local prefix = ARGV[2]
for _, name in ipairs(redis.call('SMEMBERS', ARGV[3])) do
  redis.call('DEL', prefix .. name)
end
redis.call('DEL', ARGV[3], ARGV[4])
return 1
"""


# The stored state of entries, for the guard: ARGV[1] '1' when the entries' JSON is wanted,
# ARGV[2] the tombstones hash, ARGV[3] a JSON array of entry names and keys, alternating ->
# a JSON array of position, count, tombstone[, JSON] per entry (null: none). One argument in,
# one out: the client sends and parses a batch without a Python call per value.
_READ = """
local want = ARGV[1] == '1'
local tombs = ARGV[2]
local items = cjson.decode(ARGV[3])
local null = cjson.null
local out = {}
for i = 1, #items, 2 do
  local v = redis.call('HMGET', items[i], '_position', '_applied', '_json')
  if v[3] then
    out[#out + 1] = v[1] or null
    out[#out + 1] = v[2] or null
  else
    out[#out + 1] = null
    out[#out + 1] = null
  end
  out[#out + 1] = redis.call('HGET', tombs, items[i + 1]) or null
  if want then out[#out + 1] = v[3] or null end
end
if #out == 0 then return '[]' end
return cjson.encode(out)
"""

# Entries replaced whole: ARGV[1] is a JSON array of entries, each an array of the hash's name
# then its field names and values (all strings).
_PUT = """
for _, entry in ipairs(cjson.decode(ARGV[1])) do
  local name, n = entry[1], #entry
  redis.call('DEL', name)
  local j = 2
  while j <= n do
    local stop = math.min(j + 999, n)
    redis.call('HSET', name, unpack(entry, j, stop))
    j = stop + 1
  end
end
return 1
"""


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


def _int(value: object, default: int = 0) -> int:
    text = _text(value)
    return default if text is None else int(text)


# -- the store --------------------------------------------------------------------------


class RedisStore:
    """A view's state in Redis hashes (see the module docstring for the names)."""

    kind = "redis"

    def __init__(
        self,
        url: str,
        view: str,
        collections: Sequence[Collection],
        materializer: Materializer | None = None,
        key_format: Mapping[str, str] | None = None,
    ) -> None:
        self.url = url
        self.view = view
        self.materializer = materializer
        self.collections: dict[str, Collection] = {c.name: c for c in collections}
        self.names = KeyNames.build(view, list(self.collections), key_format)
        self.key_format = dict(key_format or {})
        if url.partition("://")[0] not in _SCHEMES:
            raise StoreError(f"view {view}: bad Redis URL: use {', '.join(_SCHEMES)}://...")

    @cached_property
    def client(self) -> redis.Redis:
        """The client, made at first use: the Redis driver (~0.1 s to import) comes with the
        store's first request, not with its definition (`tributary query` of another view)."""
        import redis

        try:
            # URL options (``?socket_timeout=...``) win over these defaults.
            return redis.Redis.from_url(
                self.url, decode_responses=True, socket_connect_timeout=5, socket_timeout=60
            )
        except ValueError as exc:
            raise StoreError(f"view {self.view}: bad Redis URL: {exc}") from None

    @cached_property
    def _get(self) -> Script:
        return self.client.register_script(_GET)

    @cached_property
    def _scan(self) -> Script:
        return self.client.register_script(_SCAN)

    @cached_property
    def _swap(self) -> Script:
        return self.client.register_script(_SWAP)

    @cached_property
    def _discard(self) -> Script:
        return self.client.register_script(_DISCARD)

    @cached_property
    def _read(self) -> Script:
        return self.client.register_script(_READ)

    @cached_property
    def _put(self) -> Script:
        return self.client.register_script(_PUT)

    def collection(self, name: str) -> Collection:
        return named(self.view, self.collections, name)

    @contextmanager
    def errors(self, what: str) -> Iterator[None]:
        """Redis errors as store errors (unreachable: :class:`StoreUnavailableError`)."""
        import redis

        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailableError(
                f"view {self.view}: Redis unreachable ({what}): {exc}"
            ) from exc
        except redis.RedisError as exc:
            raise StoreError(f"view {self.view}: Redis refused {what}: {exc}") from exc

    # -- generations -----------------------------------------------------------------

    def live_generation(self) -> str:
        with self.errors("reading the live generation"):
            self.client.set(self.names.live, new_generation(), nx=True)
            live = _text(self.client.get(self.names.live))
        if live is None:  # only if someone deleted the pointer in between
            raise StoreError(f"view {self.view}: live pointer {self.names.live} vanished")
        return live

    def committed(self, generation: str) -> Commit:
        with self.errors("reading the ledger"):
            raw = self.client.hgetall(self.names.ledger(generation))
        return _commit(self.view, generation, raw)

    def writer(
        self, generation: str, *, live: bool, hooks: CommitHooks | None = None
    ) -> RedisWriter:
        return RedisWriter(self, generation, live=live, hooks=hooks or CommitHooks())

    def prepare(self, generation: str) -> None:
        self.discard(generation)
        with self.errors("preparing a generation"):
            self.client.hset(
                self.names.ledger(generation),
                mapping={"batch_id": -1, "offsets": "{}", "batches": 0},
            )

    def generations(self) -> set[str]:
        base = self.names.ledger_base
        found: set[str] = set()
        with self.errors("listing generations"):
            live = _text(self.client.get(self.names.live))
            for name in self.client.scan_iter(match=glob_escape(base) + "*", count=1000):
                found.add(str(name)[len(base) :])
        if live is not None:
            found.add(live)
        return found

    def discard(self, generation: str) -> None:
        names = self.names
        with self.errors("discarding a generation"):
            done = self._discard(
                keys=[names.live],
                args=[
                    generation,
                    names.shadow_prefix(generation),
                    names.members(generation),
                    names.ledger(generation),
                ],
            )
        if not _int(done):
            raise StoreError(f"view {self.view}: generation {generation} is live; not dropped")

    def swap_in(self, generation: str) -> str | None:
        names = self.names
        with self.errors("swapping generations"):
            reply = self._swap(
                keys=[names.live],
                args=[generation, names.shadow_base, names.members_base, names.ledger_base],
            )
        result = [_text(part) for part in reply]
        if result[0] == "unknown":
            raise StoreError(
                f"view {self.view}: generation {generation} is not in use (no ledger);"
                " prepare it before swapping it in"
            )
        return result[1] if len(result) > 1 else None

    # -- reads -----------------------------------------------------------------------

    def get(self, collection: str, key: str, generation: str | None = None) -> Entry | None:
        self.collection(collection)
        names = self.names
        with self.errors("reading an entry"):
            reply = self._get(
                keys=[names.live],
                args=[generation or "", names.shadow_base, names.entry(collection, key)],
            )
        if not reply:
            return None
        text, position, applied = (_text(v) for v in reply)
        if text is None:
            return None
        return Entry(collection, key, json.loads(text), _int(position), _int(applied))

    def scan(self, collection: str, generation: str | None = None) -> list[Entry]:
        self.collection(collection)
        names = self.names
        prefix, suffix = names.pattern(collection)
        with self.errors("scanning a collection"):
            reply = self._scan(
                keys=[names.live],
                args=[generation or "", names.shadow_base, names.members_base, prefix, suffix],
            )
        values = [_text(v) or "" for v in reply]
        out: list[Entry] = []
        for i in range(0, len(values), 4):
            name, text, position, applied = values[i : i + 4]
            key = names.key_of(collection, name)
            if key is not None:
                out.append(Entry(collection, key, json.loads(text), int(position), int(applied)))
        out.sort(key=lambda e: e.key)
        return out

    def digests(self, generation: str | None = None) -> Iterator[tuple[str, str, str]]:
        """Each collection scanned (one script call each), digested; the caller re-reads the
        ledger around it (a batch's MULTI/EXEC carries its ledger)."""
        return scan_digests(self.scan, self.collections, generation)

    def describe(self) -> str:
        kw = self.client.connection_pool.connection_kwargs
        db = kw.get("db", 0)
        if kw.get("path"):
            where = f"unix:{kw['path']}/{db}"
        else:
            where = f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{db}"
        public = "".join(f" {p}*{s}" for p, s in (self.names.pattern(c) for c in self.key_format))
        return f"redis {where} {self.names.root}:*{public}"

    def close(self) -> None:
        if "client" in self.__dict__:  # made
            self.client.close()


def _commit(view: str, generation: str, raw: object) -> Commit:
    if not isinstance(raw, Mapping) or not raw:
        return Commit.empty(view, generation)
    offsets = json.loads(_text(raw.get("offsets")) or "{}")
    return Commit(
        view,
        generation,
        _int(raw.get("batch_id"), -1),
        {str(t): {str(p): int(o) for p, o in parts.items()} for t, parts in offsets.items()},
        _int(raw.get("batches")),
    )


# -- the writer -------------------------------------------------------------------------

_CHUNK = 10_000  # members per SADD / SREM / DEL / HDEL command
_SCRIPT_ENTRIES = 20_000  # entries per call of the put script (the server holds them all)


def hash_entry(
    name: str, fields: Mapping[str, Any], position: int, applied: int, text: str
) -> list[str]:
    """An entry as the put script takes it: its name, the hash's fields rendered, the meta."""
    flat = [name]
    for field_name, value in fields.items():
        shown = render(value)
        if shown is not None:
            flat += (str(field_name), shown)
    flat += (POSITION, str(position), APPLIED, str(applied), JSON, text)
    return flat


@dataclass
class _Plan:
    """Every command of a unit, grouped (physical names; members are logical names)."""

    hashes: list[list[list[str]]] = field(default_factory=list)  # the put script's calls
    gone: list[str] = field(default_factory=list)
    tomb_set: dict[str, dict[str, int]] = field(default_factory=dict)
    tomb_del: dict[str, list[str]] = field(default_factory=dict)
    index_add: dict[str, list[str]] = field(default_factory=dict)
    index_rem: dict[str, list[str]] = field(default_factory=dict)
    members_add: set[str] = field(default_factory=set)
    members_rem: set[str] = field(default_factory=set)

    def put(
        self, name: str, fields: Mapping[str, Any], position: int, applied: int, text: str
    ) -> None:
        """Replace the hash ``name``."""
        if not self.hashes or len(self.hashes[-1]) >= _SCRIPT_ENTRIES:
            self.hashes.append([])
        self.hashes[-1].append(hash_entry(name, fields, position, applied, text))

    def index(
        self,
        names: KeyNames,
        shadow: str | None,
        collection: str,
        field_name: str,
        key: str,
        old: str | None,
        new: str | None,
    ) -> None:
        if old == new:
            return
        if old is not None:
            self.index_rem.setdefault(
                names.physical(names.index(collection, field_name, old), shadow), []
            ).append(key)
        if new is not None:
            logical = names.index(collection, field_name, new)
            self.index_add.setdefault(names.physical(logical, shadow), []).append(key)
            self.members_add.add(logical)

    def queue(self, pipe: redis.client.Pipeline, store: RedisStore, members: str) -> None:
        for entries in self.hashes:
            payload = json.dumps(entries, ensure_ascii=False, separators=(",", ":"))
            store._put(args=[payload], client=pipe)
        for i in range(0, len(self.gone), _CHUNK):
            pipe.delete(*self.gone[i : i + _CHUNK])
        for name, keys in self.index_rem.items():
            for i in range(0, len(keys), _CHUNK):
                pipe.srem(name, *keys[i : i + _CHUNK])
        for name, keys in self.index_add.items():
            for i in range(0, len(keys), _CHUNK):
                pipe.sadd(name, *keys[i : i + _CHUNK])
        for name, positions in self.tomb_set.items():
            pipe.hset(name, mapping=positions)  # type: ignore[arg-type]
        for name, keys in self.tomb_del.items():
            for i in range(0, len(keys), _CHUNK):
                pipe.hdel(name, *keys[i : i + _CHUNK])
        removed = sorted(self.members_rem)
        for i in range(0, len(removed), _CHUNK):
            pipe.srem(members, *removed[i : i + _CHUNK])
        added = sorted(self.members_add)
        for i in range(0, len(added), _CHUNK):
            pipe.sadd(members, *added[i : i + _CHUNK])


@dataclass
class _Stored:
    """What Redis holds for a batch's rows (aligned with the batch's rows)."""

    position: np.ndarray
    applied: np.ndarray
    tomb: np.ndarray
    texts: list[str | None]  # the entries' JSON (when read)


class RedisWriter(BatchWriter):
    """Applies batches to one generation of a Redis view store (one writer per generation)."""

    def __init__(
        self, store: RedisStore, generation: str, *, live: bool, hooks: CommitHooks
    ) -> None:
        super().__init__(store.view, store.materializer, generation, live=live, hooks=hooks)
        self.store = store

    def committed(self) -> Commit:
        return self.store.committed(self.generation)

    def close(self) -> None:
        """Nothing is held between batches (the store's client pools the connections)."""

    @contextmanager
    def unit(self, batch: Batch) -> Iterator[RedisUnit]:
        """WATCH the ledger and the live pointer; MULTI/EXEC at the commit."""
        store = self.store
        with store.errors(f"batch {batch.batch_id}"), store.client.pipeline() as pipe:
            pipe.watch(store.names.ledger(self.generation), store.names.live)  # type: ignore[no-untyped-call]
            yield RedisUnit(self, pipe, batch)


class RedisUnit(BatchUnit):
    """One batch's WATCH ... MULTI/EXEC on Redis."""

    def __init__(self, writer: RedisWriter, pipe: redis.client.Pipeline, batch: Batch) -> None:
        self.writer = writer
        self.store = writer.store
        self.names = writer.store.names
        self.pipe = pipe
        self.batch = batch
        self._live: str | None = None
        self._read_live = False
        self._plan = _Plan()
        self._txn: RedisTxn | None = None
        self._ledger: dict[FieldT, EncodableT] = {}

    @property
    def shadow(self) -> str | None:
        """The prefix generation of physical names (None: the generation is live)."""
        generation = self.writer.generation
        return None if self.live_generation() == generation else generation

    def live_generation(self) -> str | None:
        if not self._read_live:
            self._live = _text(self.pipe.get(self.names.live))
            self._read_live = True
        return self._live

    def ledger(self) -> Commit:
        self.live_generation()
        raw = self.pipe.hgetall(self.names.ledger(self.writer.generation))
        return _commit(self.store.view, self.writer.generation, raw)

    # -- the guarded write -------------------------------------------------------------

    def _read(self, writes: WriteColumns, texts: bool) -> _Stored:
        """The stored positions, counts and tombstones of the batch's keys (and, for
        ``texts`` or collections with lookups, the entries' JSON) in one round trip."""
        import numpy as np

        names, shadow, store = self.names, self.shadow, self.store
        pipe = store.client.pipeline(transaction=False)
        order: list[tuple[np.ndarray, int]] = []
        for code, collection in enumerate(writes.collections):
            rows = np.flatnonzero(writes.collection_codes == code)
            keys = writes.column("key", rows)
            prefix, suffix = names.pattern(collection)
            prefix = names.physical(prefix, shadow)
            tombs = names.physical(names.tombs(collection), shadow)
            want = texts or bool(store.collection(collection).lookups)
            items: list[str] = []
            for key in keys:
                items += (prefix + key + suffix, key)
            payload = json.dumps(items, ensure_ascii=False, separators=(",", ":"))
            store._read(args=["1" if want else "0", tombs, payload], client=pipe)
            order.append((rows, 4 if want else 3))
        n = writes.n
        position = np.full(n, NONE, dtype=np.int64)
        applied = np.zeros(n, dtype=np.int64)
        tomb = np.full(n, NONE, dtype=np.int64)
        out_texts: list[str | None] = [None] * n
        for (rows, width), reply in zip(order, pipe.execute(), strict=True):
            values = json.loads(_text(reply) or "[]")
            position[rows] = _ints(values[0::width], NONE)
            applied[rows] = _ints(values[1::width], 0)
            tomb[rows] = _ints(values[2::width], NONE)
            if width == 4:
                for row, text in zip(rows.tolist(), values[3::width], strict=True):
                    out_texts[row] = text
        return _Stored(position, applied, tomb, out_texts)

    def write(self, writes: WriteColumns, rejected: list[Rejected], applied: bool) -> list[Applied]:
        for collection in writes.collections:
            self.store.collection(collection)
        if writes.n == 0:
            return []
        stored = self._read(writes, applied)
        passed, counts = guard(writes, stored.position, stored.applied, stored.tomb)
        if applied:
            self._txn = RedisTxn(self.store, self.writer.generation, live=self.shadow is None)
            return self._txn.stage_batch(writes, stored, passed, counts, rejected)
        self._plan_batch(writes, stored, passed, counts, rejected)
        return []

    def _plan_batch(
        self,
        writes: WriteColumns,
        stored: _Stored,
        passed: np.ndarray,
        counts: np.ndarray,
        rejected: list[Rejected],
    ) -> None:
        """The commands of the guarded writes, from the columns (no materializer)."""
        import numpy as np

        names, shadow, plan = self.names, self.shadow, self._plan
        for code, collection in enumerate(writes.collections):
            mine = passed & (writes.collection_codes == code)
            lookups = self.store.collection(collection).lookups
            prefix, suffix = names.pattern(collection)
            physical = names.physical(prefix, shadow)
            tombs = names.tombs(collection)
            tombs_physical = names.physical(tombs, shadow)
            puts = np.flatnonzero(mine & ~writes.deleted)
            texts, fields, errors = entry_objects(writes, puts)
            keys = writes.column("key", puts)
            positions, applied = writes.position[puts].tolist(), counts[puts].tolist()
            for i, row in enumerate(puts.tolist()):
                reason = errors.get(row)
                if reason is not None:
                    rejected.append(Rejected(writes.write(row), reason))
                    continue
                key, text, entry = keys[i], texts[i], fields[i]
                assert text is not None and entry is not None
                plan.put(physical + key + suffix, entry, positions[i], applied[i], text)
                plan.members_add.add(prefix + key + suffix)
                if stored.tomb[row] != NONE:
                    plan.tomb_del.setdefault(tombs_physical, []).append(key)
                if lookups:
                    before = _fields(stored.texts[row])
                    for name in lookups:
                        plan.index(
                            names,
                            shadow,
                            collection,
                            name,
                            key,
                            _shown(before, name),
                            render(entry.get(name)),
                        )
            deletes = np.flatnonzero(mine & writes.deleted)
            keys = writes.column("key", deletes)
            for key, row, position in zip(
                keys, deletes.tolist(), writes.position[deletes].tolist(), strict=True
            ):
                plan.tomb_set.setdefault(tombs_physical, {})[key] = position
                plan.members_add.add(tombs)
                if stored.position[row] == NONE:
                    continue  # no entry to remove
                plan.gone.append(physical + key + suffix)
                plan.members_rem.add(prefix + key + suffix)
                if lookups:
                    before = _fields(stored.texts[row])
                    for name in lookups:
                        plan.index(names, shadow, collection, name, key, _shown(before, name), None)

    # -- the rest of the unit ------------------------------------------------------------

    def txn(self) -> RedisTxn:
        if self._txn is None:
            self._txn = RedisTxn(self.store, self.writer.generation, live=self.shadow is None)
        return self._txn

    def record(self, commit: Commit) -> None:
        if self._txn is not None:
            self._plan = self._txn.plan()
        self._ledger = {
            "batch_id": commit.batch_id,
            "offsets": json.dumps(commit.offsets, separators=(",", ":")),
            "batches": commit.batches,
        }

    def commit(self) -> None:
        writer, pipe = self.writer, self.pipe
        pipe.multi()
        self._plan.queue(pipe, self.store, self.names.members(writer.generation))
        pipe.hset(self.names.ledger(writer.generation), mapping=self._ledger)
        import redis

        try:
            pipe.execute()
        except redis.WatchError as exc:
            live = _text(self.store.client.get(self.names.live))
            if writer.live and live != writer.generation:
                raise writer.stale(live) from exc
            raise StoreError(
                f"view {self.store.view}: batch {self.batch.batch_id} of generation"
                f" {writer.generation} not applied: a concurrent writer changed its ledger or"
                " the live generation (the batch is retried when the job restarts)"
            ) from exc


def _ints(values: list[str | None], missing: int) -> np.ndarray:
    """Decimal texts as int64 (None: ``missing``)."""
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]

    array = pa.array(values, pa.string()).cast(pa.int64()).fill_null(missing)
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.int64)


def _fields(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    value = json.loads(text)
    return value if isinstance(value, dict) else None


def _shown(fields: Mapping[str, Any] | None, name: str) -> str | None:
    return None if fields is None else render(fields.get(name))


# -- the materializer's transaction -------------------------------------------------------


class _State(Staged):
    """An entry as the unit sees it, and its Redis hash."""

    def mapping(self) -> dict[FieldT, EncodableT]:
        out: dict[FieldT, EncodableT] = {}
        for name, value in self.fields.items():
            shown = render(value)
            if shown is not None:
                out[str(name)] = shown
        out[POSITION] = self.position
        out[APPLIED] = self.applied
        out[JSON] = self.text
        return out


class RedisTxn:
    """One batch's unit on Redis, as the materializer sees it (the
    :class:`~tributary.view_store.StoreTxn` of the Redis store): reads see the unit's pending
    writes first, then Redis; nothing is written until :meth:`queue` puts it all in the EXEC."""

    def __init__(self, store: RedisStore, generation: str, *, live: bool) -> None:
        self.store = store
        self.names = store.names
        self.generation = generation
        self.shadow = None if live else generation  # None: logical names are physical
        self._stored: dict[Ident, _State | None] = {}  # as Redis holds it before the unit
        self._pending: dict[Ident, _State | None] = {}  # None: deleted in this unit
        # (collection, lookup field, rendered value) -> pending keys holding it, so a lookup
        # costs its matches, not every pending write of the collection
        self._pending_index: dict[tuple[str, str, str], set[str]] = {}
        self._tombs: dict[Ident, int | None] = {}  # None: tombstone removed

    def _stage(self, ident: Ident, state: _State | None) -> None:
        """Make ``state`` the unit's pending state of ``ident`` (None: deleted), keeping the
        pending lookup index in step."""
        collection, key = ident
        before = self._pending.get(ident)
        for name in self.store.collection(collection).lookups:
            old = None if before is None else render(before.fields.get(name))
            new = None if state is None else render(state.fields.get(name))
            if old == new:
                continue
            if old is not None:
                self._pending_index.get((collection, name, old), set()).discard(key)
            if new is not None:
                self._pending_index.setdefault((collection, name, new), set()).add(key)
        self._pending[ident] = state

    def _physical(self, name: str) -> str:
        return self.names.physical(name, self.shadow)

    def _load(self, idents: Iterable[Ident], tombs: bool = False) -> dict[Ident, int | None]:
        """Read the stored entries (and, asked, tombstones) of keys in one round trip."""
        wanted = list(dict.fromkeys(i for i in idents if tombs or i not in self._stored))
        if not wanted:
            return {}
        pipe = self.store.client.pipeline(transaction=False)
        for collection, key in wanted:
            pipe.hmget(self._physical(self.names.entry(collection, key)), list(_META))
            if tombs:
                pipe.hget(self._physical(self.names.tombs(collection)), key)
        replies = iter(pipe.execute())
        found: dict[Ident, int | None] = {}
        for ident in wanted:
            text, position, applied = (_text(v) for v in next(replies))
            self._stored[ident] = (
                None
                if text is None
                else _State(json.loads(text), text, _int(position), _int(applied))
            )
            if tombs:
                tomb = _text(next(replies))
                found[ident] = None if tomb is None else int(tomb)
        return found

    def _current(self, ident: Ident) -> _State | None:
        if ident not in self._stored:
            self._load([ident])
        if ident in self._pending:
            return self._pending[ident]
        return self._stored[ident]

    # -- the position guard (the batch's own writes) ------------------------------------

    def stage_batch(
        self,
        writes: WriteColumns,
        stored: _Stored,
        passed: np.ndarray,
        counts: np.ndarray,
        rejected: list[Rejected],
    ) -> list[Applied]:
        """Stage the batch's writes that passed the guard; the ones that pass, with their
        entry's fields before them."""
        import numpy as np

        keys = writes.keys
        for row in range(writes.n):
            ident = (writes.collections[writes.collection_codes[row]], keys[row])
            text = stored.texts[row]
            self._stored[ident] = (
                None
                if text is None
                else _State(
                    JsonObject(text), text, int(stored.position[row]), int(stored.applied[row])
                )
            )
        rows = np.flatnonzero(passed)
        texts, fields, errors = entry_objects(writes, rows)
        applied: list[Applied] = []
        objects = writes.writes(rows)
        for i, row in enumerate(rows.tolist()):
            write = objects[i]
            ident = (write.collection, write.key)
            before = self._stored[ident]
            tomb = stored.tomb[row]
            if isinstance(write, Put):
                reason = errors.get(row)
                if reason is not None:
                    rejected.append(Rejected(write, reason))
                    continue
                text, entry = texts[i], fields[i]
                assert text is not None and entry is not None
                self._stage(ident, _State(entry, text, write.position, int(counts[row])))
                if tomb != NONE:
                    self._tombs[ident] = None
            else:
                self._stage(ident, None)
                self._tombs[ident] = write.position
            applied.append(Applied(write, None if before is None else JsonObject(before.text)))
        return applied

    # -- StoreTxn ------------------------------------------------------------------------

    def get(self, collection: str, key: str) -> Entry | None:
        self.store.collection(collection)
        state = self._current((collection, key))
        return None if state is None else state.entry(collection, key)

    def find(self, collection: str, field: str, value: Any) -> list[Entry]:
        if field not in self.store.collection(collection).lookups:
            raise StoreError(
                f"view {self.store.view}: {field} is not a lookup of {collection}"
                f" (lookups: {', '.join(self.store.collection(collection).lookups) or 'none'})"
            )
        wanted = render(value)
        if wanted is None:
            return []
        index = self._physical(self.names.index(collection, field, wanted))
        keys = {str(k) for k in self.store.client.smembers(index)}
        keys.update(self._pending_index.get((collection, field, wanted), ()))
        self._load((collection, k) for k in keys)
        out: list[Entry] = []
        for key in sorted(keys):
            state = self._current((collection, key))
            if state is not None and render(state.fields.get(field)) == wanted:
                out.append(state.entry(collection, key))
        return out

    def count(self, collection: str, field: str, value: Any) -> int:
        """The lookup index's members, each checked only where this unit read or wrote its
        entry: an untouched member's entry holds the value (the index changes with its entries,
        in the same EXEC)."""
        if field not in self.store.collection(collection).lookups:
            return len(self.find(collection, field, value))  # the same error
        wanted = render(value)
        if wanted is None:
            return 0
        index = self._physical(self.names.index(collection, field, wanted))
        keys = {str(k) for k in self.store.client.smembers(index)}
        keys.update(self._pending_index.get((collection, field, wanted), ()))
        total = 0
        for key in keys:
            ident = (collection, key)
            if ident in self._pending:
                state = self._pending[ident]
            elif ident in self._stored:
                state = self._stored[ident]
            else:
                total += 1
                continue
            if state is not None and render(state.fields.get(field)) == wanted:
                total += 1
        return total

    def put(self, collection: str, key: str, fields: Mapping[str, Any]) -> None:
        self.store.collection(collection)
        ident = (collection, key)
        current = self._current(ident)
        position, applied = (0, 0) if current is None else (current.position, current.applied)
        try:
            self._stage(ident, _State.of(fields, position, applied))
        except (TypeError, ValueError) as exc:
            raise StoreError(
                f"view {self.store.view}: derived write {collection}/{key}: {exc}"
            ) from exc

    def delete(self, collection: str, key: str) -> None:
        self.store.collection(collection)
        ident = (collection, key)
        self._current(ident)
        self._stage(ident, None)

    # -- the commit ----------------------------------------------------------------------

    def plan(self) -> _Plan:
        """Every pending write with its index, tombstone and members updates."""
        names, plan = self.names, _Plan()
        for (collection, key), final in self._pending.items():
            before = self._stored[(collection, key)]
            if before is None and final is None:
                continue
            logical = names.entry(collection, key)
            target = self._physical(logical)
            if final is None:
                plan.gone.append(target)
                plan.members_rem.add(logical)
            else:
                plan.put(target, final.fields, final.position, final.applied, final.text)
                plan.members_add.add(logical)
            for name in self.store.collection(collection).lookups:
                old = None if before is None else render(before.fields.get(name))
                new = None if final is None else render(final.fields.get(name))
                plan.index(names, self.shadow, collection, name, key, old, new)
        for (collection, key), position in self._tombs.items():
            tombs = names.tombs(collection)
            if position is None:
                plan.tomb_del.setdefault(self._physical(tombs), []).append(key)
            else:
                plan.tomb_set.setdefault(self._physical(tombs), {})[key] = position
                plan.members_add.add(tombs)
        return plan
