"""What a view is: a name, the topics it reads, a fold, and the store it writes.

The fold is a Spark transformation from the Kafka source's rows to folded rows
(:data:`projections.folding.FOLDED_SCHEMA`); most views fold each Kafka partition apart with a
columnar function (:func:`per_partition`), so the work runs on the executors next to the
records and only one row per key reaches the driver. The driver turns the folded rows into
the stores' columnar write table (:func:`split_folded`) and the store applies it with its
ledger.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from projections.folding import FOLDED_DDL
from tributary.view_model import (
    WRITE_COLUMNS,
    Delete,
    JsonObject,
    Put,
    SourceRef,
    Write,
    write_table,
)
from tributary.view_store import ViewStore

# Arrow (~0.15 s to import) comes with the first batch: a view's definition (what `tributary
# views`, `query` and `status` read) does without it.
if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

Transform = Callable[[Any], Any]  # DataFrame of Kafka records -> DataFrame of folded rows
FoldFunction = Callable[[Iterable["pa.RecordBatch"]], Iterator["pa.RecordBatch"]]

_FOLDS: dict[str, FoldFunction] = {}


def load_fold(path: str) -> FoldFunction:
    """The per-partition fold function at ``module:function`` (imported once per process)."""
    function = _FOLDS.get(path)
    if function is None:
        module, _, name = path.partition(":")
        function = getattr(importlib.import_module(module), name)
        _FOLDS[path] = function
    return function


@dataclass(frozen=True)
class PartitionFold:
    """A fold run on each Kafka partition's records apart, named by ``module:function`` so the
    executors import it: inside the project's Kafka source's read task (the records never
    reach the JVM), or as ``mapInArrow`` after Spark's own Kafka source.

    Correct when every key lives in one partition, as in keyed Kafka topics. ``options``
    (strings) reach the function as its second argument, e.g. a schema registry's URL.
    ``schema``: the Spark DDL of the rows it yields (None: the folded rows of
    :data:`projections.folding.FOLDED_SCHEMA`), e.g. a decoder's rows that a Spark
    transformation folds further.
    """

    path: str
    options: tuple[tuple[str, str], ...] = ()
    schema: str | None = None

    @property
    def ddl(self) -> str:
        return FOLDED_DDL if self.schema is None else self.schema

    def function(self) -> FoldFunction:
        """The function with its options bound."""
        fold = load_fold(self.path)
        if not self.options:
            return fold
        options = dict(self.options)

        def bound(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return fold(batches, options)  # type: ignore[call-arg]

        return bound

    def __call__(self, records: Any) -> Any:
        return records.mapInArrow(self.function(), self.ddl)


def per_partition(path: str, *, schema: str | None = None, **options: str) -> PartitionFold:
    """A per-partition fold by ``module:function`` (with string options for it; ``schema``:
    the DDL of its rows when they are not folded rows).

    A module that is not there fails here (on the driver, when the view is defined); the module
    itself is imported when the view runs (:func:`check_fold`), not here: a fold imports Arrow
    and its decoders, which the commands that only read a view's store do without."""
    module = path.partition(":")[0]
    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f"fold {path!r}: no module named {module!r}", name=module)
    return PartitionFold(path, tuple(sorted(options.items())), schema)


def check_fold(fold: PartitionFold) -> None:
    """Import ``fold``'s function on the driver before a query runs it (its executors would
    otherwise be the first to find a wrong name)."""
    load_fold(fold.path)


Fold = PartitionFold | Transform


@dataclass(frozen=True)
class QueryParam:
    """One parameter of a view query: where it comes from in an HTTP request (``path`` or
    ``query`` string), its type, and its default (``required`` when there is none).
    ``positional``: an optional parameter the command line may also give as a bare word after
    the required ones (``tributary query ctr kafka``)."""

    name: str
    kind: type[int] | type[str]
    where: Literal["path", "query"] = "query"
    default: int | str | None = None
    required: bool = False
    description: str = ""
    minimum: int | None = None
    maximum: int | None = None
    positional: bool = False


@dataclass(frozen=True)
class Query:
    """A read a view offers to services: ``tributary query NAME``, ``GET <path>`` over HTTP and
    the Python client run the same ``run(**params)``, which returns JSON-ready data. ``run``
    raises :class:`~connectors.errors.StoreUnavailableError` when the store cannot be reached
    (HTTP 503) and ``LookupError`` when the thing asked for does not exist (HTTP 404)."""

    name: str
    path: str  # e.g. "/timeline/{user_id}"
    params: tuple[QueryParam, ...]
    run: Callable[..., Any]
    description: str = ""


@dataclass(frozen=True)
class View:
    """A view: its name, the topics it reads, its fold, the store that holds it, and the
    queries it serves.

    ``verify`` compares the live view with what it must hold according to the source of truth
    (`tributary verify`), returning readable differences (none: the view is right).
    ``also``: more stores that receive every batch (e.g. a Kafka topic for downstream teams
    beside the PostgreSQL tables services read); each keeps its own ledger. ``stateful``: the
    fold keeps state in Spark's checkpoint (windows, joins, pattern timers), so a lost
    checkpoint cannot be resumed from the store's offsets: the view is rebuilt from offset zero
    into a shadow generation instead. ``output_mode``: Spark's output mode of the query
    (``update`` for aggregations that publish each changed window at once). ``metrics``:
    counters the view reports (``tributary status``, ``GET /metrics``), e.g. late events.
    ``decode``: a per-partition stage run inside the Kafka source's read task (its rows, of
    its own schema, are what ``fold`` receives instead of Kafka records), so records are
    decoded next to the consumer and never cross into the JVM raw.
    """

    name: str
    topics: tuple[str, ...]
    fold: Fold
    store: ViewStore
    description: str = ""
    options: dict[str, str] = field(default_factory=dict)  # extra Kafka source options
    queries: tuple[Query, ...] = ()
    also: tuple[ViewStore, ...] = ()
    stateful: bool = False
    output_mode: Literal["append", "update"] = "append"  # Spark's, for stateful folds
    metrics: Callable[[], dict[str, int]] | None = None  # counters for status and /metrics
    verify: Callable[[], list[str]] | None = None  # differences from the source of truth
    decode: PartitionFold | None = None  # runs in the source's read task, before ``fold``

    @property
    def stores(self) -> tuple[ViewStore, ...]:
        """Every store of the view, the primary last (it commits each batch last)."""
        return (*self.also, self.store)


@dataclass(frozen=True)
class DeadLetter:
    """A record a view could not use, and why (it goes to the view's dead-letter topic)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: str
    stage: str  # "decode" (the fold refused it) or "write" (the store refused it)

    @classmethod
    def refused_by_fold(cls, row: dict[str, Any]) -> DeadLetter:
        """The dead letter of a folded row with an error (the fold refused its record)."""
        return cls(
            row["topic"] or "",
            int(row["partition"] or 0),
            int(row["offset"] or 0),
            row["raw_key"],
            row["raw_value"],
            row["error"],
            "decode",
        )


def split_folded(table: pa.Table) -> tuple[pa.Table, list[DeadLetter]]:
    """A batch's folded rows as the stores' columnar write table (one row per collection and
    key) and its dead letters (one Python object per rejected record: the rare path).

    A key folded in two partitions (a re-partitioned topic) appears twice: its rows are merged
    by position (:func:`_merge`); every other row stays in its columns."""
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    errors = table.column("error")
    if errors.null_count < table.num_rows:
        bad = pc.is_valid(errors)
        dead = [DeadLetter.refused_by_fold(row) for row in table.filter(bad).to_pylist()]
        table = table.filter(pc.invert(bad))
    else:
        dead = []
    writes = table.select(list(WRITE_COLUMNS))
    if writes.num_rows < 2:
        return writes, dead
    counts = writes.group_by(["collection", "key"]).aggregate([("position", "count")])
    if pc.max(counts.column("position_count")).as_py() <= 1:
        return writes, dead
    twice = counts.filter(pc.greater(counts.column("position_count"), 1))
    repeated = pc.is_in(
        pc.binary_join_element_wise(writes.column("collection"), writes.column("key"), "\x1f"),
        value_set=pc.binary_join_element_wise(
            twice.column("collection"), twice.column("key"), "\x1f"
        ),
    )
    merged, _ = writes_from_folded(writes.filter(repeated))
    return pa.concat_tables(
        [writes.filter(pc.invert(repeated)), write_table(merged).select(list(WRITE_COLUMNS))]
    ), dead


def writes_from_folded(table: pa.Table) -> tuple[list[Write], list[DeadLetter]]:
    """Store writes and dead letters from a batch's folded rows as Python objects (one per
    folded row; a key folded in two partitions is merged by position). The columnar path is
    :func:`split_folded`; this one serves tests and the rare repeated keys."""
    rows = table.to_pylist()
    writes: dict[tuple[str, str], Write] = {}
    dead: list[DeadLetter] = []
    for row in rows:
        if row.get("error") is not None:
            dead.append(DeadLetter.refused_by_fold(row))
            continue
        source = SourceRef(row["topic"] or "", int(row["partition"] or 0), int(row["offset"] or 0))
        write: Write
        if row["deleted"]:
            write = Delete(row["collection"], row["key"], int(row["position"]), source)
        else:
            write = Put(
                row["collection"],
                row["key"],
                int(row["position"]),
                JsonObject(row["fields"], row["member"]),
                tuple(row["changes"] or ()),
                bool(row["fresh"]),
                source,
            )
        ident = (write.collection, write.key)
        previous = writes.get(ident)
        writes[ident] = write if previous is None else _merge(previous, write)
    return list(writes.values()), dead


def _merge(a: Write, b: Write) -> Write:
    first, last = (a, b) if a.position <= b.position else (b, a)
    if isinstance(last, Put) and isinstance(first, Put) and not last.fresh:
        changes = tuple(sorted(set(first.folded) | set(last.folded)))
        return Put(
            last.collection,
            last.key,
            last.position,
            last.fields,
            changes,
            first.fresh,
            last.source,
        )
    return last


def dead_letters_of(rejected: Sequence[Any], view: str) -> list[DeadLetter]:
    """Dead letters for writes a store refused (their last source record, and why)."""
    out = []
    for item in rejected:
        write = item.write
        source = write.source or SourceRef("", 0, 0)
        value = None
        if isinstance(write, Put):
            from tributary.view_model import fields_json

            value = fields_json(write.fields).encode()
        out.append(
            DeadLetter(
                source.topic,
                source.partition,
                source.offset,
                write.key.encode(),
                value,
                f"view {view} could not write {write.collection}/{write.key}: {item.reason}",
                "write",
            )
        )
    return out
