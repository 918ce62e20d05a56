"""Comparing two generations of a view's store (a verified rebuild compares the shadow with the
live generation before the swap).

Every store lists a generation as ``(collection, key, digest)`` per entry
(:meth:`~tributary.view_store.ViewStore.digests`); the digest is :func:`entry_digest`, a
BLAKE2b of the canonical JSON of the entry's fields and position. The applied count is left
out: a compacted topic may have dropped changes the live generation counted, so a rebuild from
offset zero counts fewer while holding the same entry.

:func:`compare_generations` reads both listings, each between two reads of its generation's
ledger (a listing during which a batch committed is read again), and lists the differences
with both entries: missing in the shadow, missing in the live generation, or different.
"""

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from connectors.errors import StoreError
from tributary.view_model import Commit, Entry

Digest = tuple[str, str, str]
"""``(collection, key, digest)`` of one entry."""

LISTING_ATTEMPTS = 5  # listings of a generation that a committing batch may spoil in a row


class Listable(Protocol):
    view: str

    def digests(self, generation: str | None = None) -> Iterator[Digest]: ...

    def committed(self, generation: str) -> Commit: ...

    def get(self, collection: str, key: str, generation: str | None = None) -> Entry | None: ...


def canonical(value: Any) -> str:
    """JSON with sorted keys and no spaces (values JSON lacks, e.g. dates, as their text)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def entry_digest(entry: Entry) -> str:
    """A stable digest of what a store holds for an entry: its fields and its position."""
    text = canonical({"fields": entry.fields, "position": entry.position})
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def scan_digests(scan: Any, collections: Iterable[str], generation: str | None) -> Iterator[Digest]:
    """Digests of every entry a store's ``scan(collection, generation)`` returns, by
    collection and key (the stores whose own reads give entries use this)."""
    for collection in sorted(collections):
        for entry in sorted(scan(collection, generation), key=lambda e: e.key):
            yield collection, entry.key, entry_digest(entry)


@dataclass(frozen=True)
class Difference:
    """One entry that differs between the generations (None: the generation lacks it)."""

    collection: str
    key: str
    live: Entry | None
    shadow: Entry | None

    @property
    def kind(self) -> str:
        if self.shadow is None:
            return "missing in shadow"
        if self.live is None:
            return "missing in live"
        return "different"

    def as_dict(self) -> dict[str, Any]:
        def side(entry: Entry | None) -> dict[str, Any] | None:
            if entry is None:
                return None
            return {"fields": entry.fields, "position": entry.position}

        return {
            "collection": self.collection,
            "key": self.key,
            "kind": self.kind,
            "live": side(self.live),
            "shadow": side(self.shadow),
        }


@dataclass(frozen=True)
class Comparison:
    """Two generations of one store compared: entries of each, and what differs."""

    view: str
    kind: str  # the store's kind (postgres, redis, tantivy, kafka)
    live: str
    shadow: str
    live_commit: Commit
    shadow_commit: Commit
    live_entries: int
    shadow_entries: int
    different: int  # entries that differ, all of them
    differences: list[Difference] = field(default_factory=list)  # the first ``limit``, with values

    @property
    def identical(self) -> bool:
        return self.different == 0

    @property
    def same_positions(self) -> bool:
        """Whether both generations applied the same source offsets."""
        return same_offsets(self.live_commit.offsets, self.shadow_commit.offsets)

    def as_dict(self) -> dict[str, Any]:
        return {
            "view": self.view,
            "store": self.kind,
            "live": self.live,
            "shadow": self.shadow,
            "offsets": self.live_commit.offsets,
            "shadow_offsets": self.shadow_commit.offsets,
            "live_entries": self.live_entries,
            "shadow_entries": self.shadow_entries,
            "identical": self.identical,
            "different": self.different,
            "differences": [d.as_dict() for d in self.differences],
        }


def same_offsets(a: Mapping[str, Mapping[str, int]], b: Mapping[str, Mapping[str, int]]) -> bool:
    """Whether two ledgers reached the same offsets (a partition one lacks counts as 0)."""
    keys = {(t, p) for side in (a, b) for t, parts in side.items() for p in parts}
    return all(a.get(t, {}).get(p, 0) == b.get(t, {}).get(p, 0) for t, p in keys)


def listing(store: Listable, generation: str) -> tuple[Commit, dict[tuple[str, str], str]]:
    """A generation's digests and the ledger they belong to: read between two reads of the
    ledger, again when a batch committed meanwhile (a store's batch is one atomic unit with
    its ledger, so an unchanged ledger means an unchanged generation)."""
    for _ in range(LISTING_ATTEMPTS):
        before = store.committed(generation)
        digests = {(c, k): d for c, k, d in store.digests(generation)}
        after = store.committed(generation)
        if _same_commit(before, after):
            return before, digests
    raise StoreError(
        f"view {store.view}: generation {generation} changed during each of"
        f" {LISTING_ATTEMPTS} listings (a batch committed each time); try again"
    )


def _same_fields(a: Entry | None, b: Entry | None) -> bool:
    return a is not None and b is not None and canonical(a.fields) == canonical(b.fields)


def _same_commit(a: Commit, b: Commit) -> bool:
    return (a.batch_id, a.batches, a.offsets) == (b.batch_id, b.batches, b.offsets)


def compare_generations(
    store: Listable,
    live: str,
    shadow: str,
    *,
    kind: str = "",
    limit: int = 100,
    positions: bool = True,
) -> Comparison:
    """Compare generation ``shadow`` of ``store`` with ``live``: every entry's key and digest;
    the first ``limit`` differences (by collection and key) are listed with both entries.

    ``positions=False``: an entry whose fields are equal in both generations is the same even
    if its position differs. A stateful view (windows, sessions, joins) emits an entry when its
    state says so, and the position it records is that of the micro-batch it came out of: a
    rebuild in larger batches gives the same fields at other positions."""
    live_commit, live_digests = listing(store, live)
    shadow_commit, shadow_digests = listing(store, shadow)
    differing = sorted(
        ident
        for ident in live_digests.keys() | shadow_digests.keys()
        if live_digests.get(ident) != shadow_digests.get(ident)
    )
    if not positions:
        differing = [
            (collection, key)
            for collection, key in differing
            if not _same_fields(
                store.get(collection, key, live), store.get(collection, key, shadow)
            )
        ]
    differences = [
        Difference(
            collection,
            key,
            store.get(collection, key, live) if (collection, key) in live_digests else None,
            store.get(collection, key, shadow) if (collection, key) in shadow_digests else None,
        )
        for collection, key in differing[:limit]
    ]
    return Comparison(
        store.view,
        kind or str(getattr(store, "kind", "")),
        live,
        shadow,
        live_commit,
        shadow_commit,
        len(live_digests),
        len(shadow_digests),
        len(differing),
        differences,
    )
