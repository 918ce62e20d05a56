"""The interface every view store implements (PostgreSQL, Redis, tantivy, Kafka).

A store keeps one view's state in *generations*: the live one serves reads; a rebuild writes a
shadow generation that :meth:`ViewStore.swap_in` makes live atomically for readers, or
:meth:`ViewStore.discard` throws away without touching the live one. Each generation has its own
ledger, kept in the same atomic unit as its data, so the store - not Spark's checkpoint - says
which offsets a view has applied.

A view may add a *materializer*: a function run inside the batch's atomic unit, after the
guarded writes, that derives more state from the writes that were applied (a join, counters, a
fan-out). It works through :class:`StoreTxn`, which every store offers, so the same
materializer runs on any store.

The protocol every writer follows (ledger, guards, generations, materializer, hooks) is written
once, in :mod:`connectors.stores.protocol`; each store supplies its atomic unit.
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tributary.view_model import Applied, Batch, Commit, Entry, Rejected

BatchHook = Callable[[int], None]
RejectHandler = Callable[[Sequence[Rejected]], None]


@dataclass(frozen=True)
class Collection:
    """A named set of keyed entries; ``lookups`` are fields a materializer may ``find`` by."""

    name: str
    lookups: tuple[str, ...] = ()


@dataclass(frozen=True)
class CommitHooks:
    """Callbacks with the batch id just before and just after the store commits a batch
    (crash tests stop the process at exactly those points)."""

    before_commit: BatchHook | None = None
    after_commit: BatchHook | None = None


class StoreTxn(Protocol):
    """One batch's open atomic unit, as a materializer sees it (reads see its own writes)."""

    def get(self, collection: str, key: str) -> Entry | None: ...

    def find(self, collection: str, field: str, value: Any) -> list[Entry]:
        """Live entries whose ``field`` equals ``value`` (``field`` must be a lookup)."""
        ...

    def count(self, collection: str, field: str, value: Any) -> int:
        """How many entries :meth:`find` returns, without reading them where the store can
        count its lookup index (a count that grows with the entries costs no more reads)."""
        ...

    def put(self, collection: str, key: str, fields: Mapping[str, Any]) -> None:
        """A derived write: not position-guarded, keeps the entry's position and count."""
        ...

    def delete(self, collection: str, key: str) -> None: ...


Materializer = Callable[[StoreTxn, Sequence[Applied]], None]


class StoreWriter(Protocol):
    """Applies batches to one generation of a view's store."""

    def committed(self) -> Commit:
        """This generation's ledger as the store holds it now."""
        ...

    def apply(
        self,
        batch: Batch,
        on_rejected: RejectHandler | None = None,
        gate: Callable[[], None] | None = None,
    ) -> bool:
        """Apply the batch and record it in the ledger atomically; False if already applied.

        Writes the store cannot hold go to ``on_rejected`` (before the commit) and the rest of
        the batch is applied. ``gate`` runs just before the commit: an error from it leaves the
        store as it was (a view's primary store waits there for its other stores). Raises
        :class:`~connectors.errors.LedgerGapError` when the batch starts past what the store
        reached, and :class:`~connectors.errors.StaleGenerationError` when a live writer's
        generation was replaced.
        """
        ...

    def close(self) -> None: ...


class ViewStore(Protocol):
    """Where one view's generations live."""

    view: str
    kind: str

    def live_generation(self) -> str:
        """The live generation; the first call for a view creates one."""
        ...

    def committed(self, generation: str) -> Commit: ...

    def writer(
        self, generation: str, *, live: bool, hooks: CommitHooks | None = None
    ) -> StoreWriter: ...

    def prepare(self, generation: str) -> None:
        """Start a rebuild: an empty shadow generation, recorded as in use."""
        ...

    def generations(self) -> set[str]:
        """Generations in use: the live one and any being built."""
        ...

    def discard(self, generation: str) -> None:
        """Drop a shadow generation; the live one is not touched."""
        ...

    def swap_in(self, generation: str) -> str | None:
        """Make ``generation`` live atomically for readers; returns the one it replaced."""
        ...

    def get(self, collection: str, key: str, generation: str | None = None) -> Entry | None:
        """One entry of a generation (default: the live one)."""
        ...

    def scan(self, collection: str, generation: str | None = None) -> list[Entry]:
        """Every live entry of a collection (tests and `verify` compare views with it)."""
        ...

    def digests(self, generation: str | None = None) -> Iterator[tuple[str, str, str]]:
        """``(collection, key, digest)`` of every live entry of a generation (default: the live
        one), by collection and key; the digest is
        :func:`connectors.stores.compare.entry_digest` (fields and position), so two
        generations compare with :func:`connectors.stores.compare.compare_generations`."""
        ...

    def describe(self) -> str:
        """Where the store is, for status lines (no secrets)."""
        ...

    def close(self) -> None: ...


def new_generation() -> str:
    """A fresh generation id, short and safe inside table, key and folder names."""
    import uuid

    return "g" + uuid.uuid4().hex[:10]
