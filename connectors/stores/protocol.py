"""The protocol every store writer follows, written once; each store supplies its atomic unit.

:meth:`BatchWriter.apply` runs, for every store:

1. the batch's writes as columns (:class:`~connectors.stores.writes.WriteColumns`), at most
   one per key of a collection;
2. the store's atomic unit opened (:meth:`BatchWriter.unit`);
3. a live writer stops if its generation is no longer the live one
   (:class:`~connectors.errors.StaleGenerationError`);
4. the ledger read inside the unit: a batch whose end offsets it reached is skipped whole
   (``False``), one that starts past them is refused (:class:`~connectors.errors.LedgerGapError`);
5. the guarded bulk write (:meth:`BatchUnit.write`: the position guard, applied counts,
   tombstones), the materializer (when the store has one) through the unit's
   :class:`~tributary.view_store.StoreTxn`, the ledger record (offsets merged, the batch id,
   one batch more);
6. the writes the store refused handed to ``on_rejected``, the caller's ``gate`` (an error
   there leaves the store as it was), ``hooks.before_commit``, the unit's commit,
   ``hooks.after_commit``.

A store's unit: PostgreSQL one transaction (a COPY into a staging table, one merge statement
per collection); Redis one WATCH/MULTI/EXEC; tantivy one index commit carrying the ledger
document; Kafka a batched produce, then the ledger record.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TypeVar

from connectors.errors import LedgerGapError, StaleGenerationError, StoreError
from connectors.stores.writes import WriteColumns
from tributary.view_model import Applied, Batch, Commit, Rejected, covers, gaps, merge_offsets
from tributary.view_store import CommitHooks, Materializer, RejectHandler, StoreTxn

T = TypeVar("T")


def named(view: str, collections: Mapping[str, T], name: str) -> T:
    """A view's collection called ``name`` (whatever a store keeps per collection), or a
    :class:`StoreError` naming the collections the view has."""
    try:
        return collections[name]
    except KeyError:
        raise StoreError(
            f"view {view} has no collection {name!r} (it has {', '.join(sorted(collections))})"
        ) from None


class BatchUnit(ABC):
    """One batch's atomic unit in a store: what each store implements."""

    @abstractmethod
    def live_generation(self) -> str | None:
        """The view's live generation as the unit sees it (None: none yet)."""

    @abstractmethod
    def ledger(self) -> Commit:
        """The writer's generation's ledger, read inside the unit."""

    @abstractmethod
    def write(
        self, writes: WriteColumns, rejected: list[Rejected], applied: bool
    ) -> Sequence[Applied]:
        """Apply the writes newer than the stored positions (in the unit); the writes the
        store cannot hold go to ``rejected``. With ``applied``, return the writes that passed
        with their entries' fields before them (for the materializer), else nothing."""

    @abstractmethod
    def txn(self) -> StoreTxn:
        """The unit as a materializer sees it (reads see the unit's own writes)."""

    @abstractmethod
    def record(self, commit: Commit) -> None:
        """Put the generation's new ledger into the unit."""

    @abstractmethod
    def commit(self) -> None:
        """Make the unit's writes and ledger durable and visible, together."""


class BatchWriter(ABC):
    """A store writer of one generation: the protocol of :meth:`apply` around the store's
    :meth:`unit`."""

    def __init__(
        self,
        view: str,
        materializer: Materializer | None,
        generation: str,
        *,
        live: bool,
        hooks: CommitHooks,
    ) -> None:
        self.view = view
        self.materializer = materializer
        self.generation = generation
        self.live = live
        self.hooks = hooks

    @abstractmethod
    def unit(self, batch: Batch) -> AbstractContextManager[BatchUnit]:
        """Open the batch's atomic unit; leaving it without :meth:`BatchUnit.commit` (or
        with an error) leaves the store as it was."""

    @abstractmethod
    def committed(self) -> Commit: ...

    @abstractmethod
    def close(self) -> None: ...

    def stale(self, live: str | None) -> StaleGenerationError:
        return StaleGenerationError(
            f"view {self.view} was rebuilt (live generation {live}, this job runs"
            f" {self.generation}); restart the job to continue from the new generation"
        )

    def apply(
        self,
        batch: Batch,
        on_rejected: RejectHandler | None = None,
        gate: Callable[[], None] | None = None,
    ) -> bool:
        """Apply the batch and record it in the ledger atomically; False if already applied
        (see :class:`~tributary.view_store.StoreWriter`)."""
        writes = WriteColumns.of(batch.writes)
        writes.check_unique()
        with self.unit(batch) as unit:
            if self.live:
                live = unit.live_generation()
                if live != self.generation:
                    raise self.stale(live)
            commit = unit.ledger()
            if covers(commit.offsets, batch.offsets):
                return False
            if batch.start is not None:
                problems = gaps(commit.offsets, batch.start)
                if problems:
                    raise LedgerGapError(
                        f"view {self.view}: batch {batch.batch_id} does not continue from the"
                        f" store ({'; '.join(problems)})"
                    )
            rejected: list[Rejected] = []
            applied = unit.write(writes, rejected, self.materializer is not None)
            if self.materializer is not None and applied:
                self.materializer(unit.txn(), applied)
            unit.record(
                Commit(
                    self.view,
                    self.generation,
                    batch.batch_id,
                    merge_offsets(commit.offsets, batch.offsets),
                    commit.batches + 1,
                )
            )
            if rejected and on_rejected is not None:
                on_rejected(rejected)
            if gate is not None:
                gate()
            if self.hooks.before_commit is not None:
                self.hooks.before_commit(batch.batch_id)
            unit.commit()
        if self.hooks.after_commit is not None:
            self.hooks.after_commit(batch.batch_id)
        return True
