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

One batch is one MULTI/EXEC: WATCH the generation's ledger and the live pointer, read the
ledger and the stored positions of the batch's keys, apply the position guard in Python, run
the materializer on an overlay of the unit's pending writes, then queue every write, index and
members update and the ledger update and EXEC. Nothing reaches Redis before EXEC, so a writer
killed before it leaves neither data nor ledger. Reads (``get``, ``scan``) and ``swap_in`` /
``discard`` are Lua scripts, so a reader sees a generation before or after a swap, never half.
"""

import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis
from redis.typing import EncodableT, FieldT

from connectors.errors import (
    LedgerGapError,
    StaleGenerationError,
    StoreError,
    StoreUnavailableError,
)
from connectors.stores.base import (
    Collection,
    CommitHooks,
    Materializer,
    RejectHandler,
    new_generation,
    run_materializer,
)
from connectors.stores.model import (
    Applied,
    Batch,
    Commit,
    Entry,
    Put,
    Rejected,
    Write,
    applied_count,
    check_unique,
    covers,
    fields_json,
    gaps,
    merge_offsets,
)

log = logging.getLogger(__name__)

POSITION = "_position"
APPLIED = "_applied"
JSON = "_json"
_META = (JSON, POSITION, APPLIED)

Ident = tuple[str, str]  # (collection, key)

# -- names ------------------------------------------------------------------------------


def render(value: Any) -> str | None:
    """A field value as a hash field (and index value) shows it; None: the field is left out."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
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
    ) -> "KeyNames":
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
        try:
            # URL options (``?socket_timeout=...``) win over these defaults.
            self.client = redis.Redis.from_url(
                url, decode_responses=True, socket_connect_timeout=5, socket_timeout=60
            )
        except ValueError as exc:
            raise StoreError(f"view {view}: bad Redis URL: {exc}") from None
        self._get = self.client.register_script(_GET)
        self._scan = self.client.register_script(_SCAN)
        self._swap = self.client.register_script(_SWAP)
        self._discard = self.client.register_script(_DISCARD)

    def collection(self, name: str) -> Collection:
        try:
            return self.collections[name]
        except KeyError:
            raise StoreError(
                f"view {self.view} has no collection {name!r}"
                f" (it has {', '.join(sorted(self.collections))})"
            ) from None

    @contextmanager
    def errors(self, what: str) -> Iterator[None]:
        """Redis errors as store errors (unreachable: :class:`StoreUnavailableError`)."""
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
    ) -> "RedisWriter":
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


class RedisWriter:
    """Applies batches to one generation of a Redis view store (one writer per generation)."""

    def __init__(
        self, store: RedisStore, generation: str, *, live: bool, hooks: CommitHooks
    ) -> None:
        self.store = store
        self.generation = generation
        self.live = live
        self.hooks = hooks

    def committed(self) -> Commit:
        return self.store.committed(self.generation)

    def close(self) -> None:
        """Nothing is held between batches (the store's client pools the connections)."""

    def _stale(self, live: str | None) -> StaleGenerationError:
        return StaleGenerationError(
            f"view {self.store.view} was rebuilt (live generation {live}, this job runs"
            f" {self.generation}); restart the job to continue from the new generation"
        )

    def apply(self, batch: Batch, on_rejected: RejectHandler | None = None) -> bool:
        check_unique(batch.writes)
        store, generation = self.store, self.generation
        try:
            with store.errors(f"batch {batch.batch_id}"):
                done = self._unit(batch, on_rejected)
        except _Collided as exc:
            with store.errors("reading the live generation"):
                live = _text(store.client.get(store.names.live))
            if self.live and live != generation:
                raise self._stale(live) from exc
            raise StoreError(
                f"view {store.view}: batch {batch.batch_id} of generation {generation} not"
                " applied: a concurrent writer changed its ledger or the live generation"
                " (the batch is retried when the job restarts)"
            ) from exc
        if done and self.hooks.after_commit is not None:
            self.hooks.after_commit(batch.batch_id)
        return done

    def _unit(self, batch: Batch, on_rejected: RejectHandler | None) -> bool:
        """One WATCH ... MULTI/EXEC unit; False if the ledger already covers the batch."""
        store, names, generation = self.store, self.store.names, self.generation
        view = store.view
        ledger = names.ledger(generation)
        with store.client.pipeline() as pipe:
            pipe.watch(ledger, names.live)  # type: ignore[no-untyped-call]
            live = _text(pipe.get(names.live))
            if self.live and live != generation:
                raise self._stale(live)
            commit = _commit(view, generation, pipe.hgetall(ledger))
            if covers(commit.offsets, batch.offsets):
                return False
            if batch.start is not None:
                problems = gaps(commit.offsets, batch.start)
                if problems:
                    raise LedgerGapError(
                        f"view {view}: batch {batch.batch_id} does not continue from the"
                        f" store ({'; '.join(problems)})"
                    )
            txn = RedisTxn(store, generation, live=live == generation)
            rejected: list[Rejected] = []
            applied = txn.guard(batch.writes, rejected)
            run_materializer(store.materializer, txn, applied)
            pipe.multi()
            txn.queue(pipe)
            pipe.hset(
                ledger,
                mapping={
                    "batch_id": batch.batch_id,
                    "offsets": json.dumps(
                        merge_offsets(commit.offsets, batch.offsets), separators=(",", ":")
                    ),
                    "batches": commit.batches + 1,
                },
            )
            if rejected and on_rejected is not None:
                on_rejected(rejected)
            if self.hooks.before_commit is not None:
                self.hooks.before_commit(batch.batch_id)
            try:
                pipe.execute()
            except redis.WatchError as exc:
                raise _Collided(str(exc)) from exc
        return True


class _Collided(Exception):
    """EXEC found a watched key (the ledger, the live pointer) changed: nothing was written."""


# -- the materializer's transaction -------------------------------------------------------


@dataclass(frozen=True)
class _State:
    """An entry as the unit sees it: parsed fields, their exact JSON, position, count."""

    fields: Mapping[str, Any]
    text: str
    position: int
    applied: int

    def entry(self, collection: str, key: str) -> Entry:
        return Entry(collection, key, json.loads(self.text), self.position, self.applied)

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


def _state_of(fields: Mapping[str, Any], position: int, applied: int) -> _State:
    text = fields_json(fields)
    parsed = json.loads(text)
    if not isinstance(parsed, dict):
        raise ValueError(f"fields must be a JSON object, got {text[:80]!r}")
    return _State(parsed, text, position, applied)


class RedisTxn:
    """One batch's unit on Redis, as the materializer sees it (the
    :class:`~connectors.stores.base.StoreTxn` of the Redis store): reads see the unit's pending
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
        for field in self.store.collection(collection).lookups:
            old = None if before is None else render(before.fields.get(field))
            new = None if state is None else render(state.fields.get(field))
            if old == new:
                continue
            if old is not None:
                self._pending_index.get((collection, field, old), set()).discard(key)
            if new is not None:
                self._pending_index.setdefault((collection, field, new), set()).add(key)
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

    def guard(self, writes: Sequence[Write], rejected: list[Rejected]) -> list[Applied]:
        """Stage the writes newer than the stored positions; the ones that pass, with their
        entry's fields before them."""
        for write in writes:
            self.store.collection(write.collection)
        tombs = self._load(((w.collection, w.key) for w in writes), tombs=True)
        applied: list[Applied] = []
        for write in writes:
            ident = (write.collection, write.key)
            stored, tomb = self._stored[ident], tombs[ident]
            known = [
                p for p in (None if stored is None else stored.position, tomb) if p is not None
            ]
            floor = max(known) if known else None
            if floor is not None and write.position <= floor:
                continue
            if isinstance(write, Put):
                count = applied_count(floor, 0 if stored is None else stored.applied, write)
                try:
                    self._stage(ident, _state_of(write.fields, write.position, count))
                except (TypeError, ValueError) as exc:
                    rejected.append(Rejected(write, f"{type(exc).__name__}: {exc}"))
                    continue
                if tomb is not None:
                    self._tombs[ident] = None
            else:
                self._stage(ident, None)
                self._tombs[ident] = write.position
            applied.append(Applied(write, None if stored is None else json.loads(stored.text)))
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

    def put(self, collection: str, key: str, fields: Mapping[str, Any]) -> None:
        self.store.collection(collection)
        ident = (collection, key)
        current = self._current(ident)
        position, applied = (0, 0) if current is None else (current.position, current.applied)
        try:
            self._stage(ident, _state_of(fields, position, applied))
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

    def queue(self, pipe: "redis.client.Pipeline") -> None:
        """Queue every pending write with its index, tombstone and members updates."""
        names = self.names
        added: set[str] = set()
        removed: set[str] = set()
        for (collection, key), final in self._pending.items():
            before = self._stored[(collection, key)]
            if before is None and final is None:
                continue
            logical = names.entry(collection, key)
            target = self._physical(logical)
            pipe.delete(target)
            if final is None:
                removed.add(logical)
            else:
                pipe.hset(target, mapping=final.mapping())
                added.add(logical)
            for field in self.store.collection(collection).lookups:
                old = None if before is None else render(before.fields.get(field))
                new = None if final is None else render(final.fields.get(field))
                if old == new:
                    continue
                if old is not None:
                    pipe.srem(self._physical(names.index(collection, field, old)), key)
                if new is not None:
                    index = names.index(collection, field, new)
                    pipe.sadd(self._physical(index), key)
                    added.add(index)
        for (collection, key), position in self._tombs.items():
            tombs = names.tombs(collection)
            if position is None:
                pipe.hdel(self._physical(tombs), key)
            else:
                pipe.hset(self._physical(tombs), key, position)
                added.add(tombs)
        if removed:
            pipe.srem(names.members(self.generation), *sorted(removed))
        if added:
            pipe.sadd(names.members(self.generation), *sorted(added))
