"""Several views folded in one pass over the same records.

Views need not read their topics apart: one streaming query reads each Kafka partition's
records once (the union of the views' topics) and runs every member view's per-partition fold
over the records of the member's own topics, inside the same read task. Each folded row is
tagged with its view (:data:`VIEW_COLUMN`), and the driver hands each view its own rows. A
member whose store is ahead of the others (its ledger covers more) folds only the records past
its own offsets (``skip``), so no store ever sees a record twice.
"""

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from projections.folding import FOLDED_DDL, FOLDED_SCHEMA
from projections.view import PartitionFold, check_fold

VIEW_COLUMN = "view"
TOGETHER_DDL = f"{FOLDED_DDL}, {VIEW_COLUMN} string"
TOGETHER_SCHEMA = FOLDED_SCHEMA.append(pa.field(VIEW_COLUMN, pa.string()))

Offsets = Mapping[str, Mapping[str, int]]


@dataclass(frozen=True)
class Member:
    """One view of a shared fold: its name, the topics it reads, its per-partition fold, and
    the offsets below which its stores already hold every record (topic -> partition ->
    offset)."""

    view: str
    topics: tuple[str, ...]
    fold: PartitionFold
    skip: Offsets


def together(members: Sequence[Member]) -> PartitionFold:
    """The per-partition fold that runs every member's fold over the same records."""
    for m in members:
        check_fold(m.fold)
    spec = [
        {
            "view": m.view,
            "topics": list(m.topics),
            "path": m.fold.path,
            "options": dict(m.fold.options),
            "skip": m.skip,
        }
        for m in members
    ]
    return PartitionFold(
        "projections.together:fold_together", (("members", json.dumps(spec)),), TOGETHER_DDL
    )


def past(batch: pa.RecordBatch, topics: Sequence[str], skip: Offsets) -> pa.RecordBatch:
    """The records of ``batch`` (Kafka source columns) of ``topics``, at or past the offsets
    of ``skip``."""
    if batch.num_rows == 0:
        return batch
    keep = pc.is_in(batch.column("topic"), pa.array(list(topics), pa.string()))
    for topic, parts in skip.items():
        for partition, offset in parts.items():
            below = pc.and_(
                pc.and_(
                    pc.equal(batch.column("topic"), topic),
                    pc.equal(batch.column("partition"), int(partition)),
                ),
                pc.less(batch.column("offset"), int(offset)),
            )
            keep = pc.and_(keep, pc.invert(below))
    return batch.filter(keep)


def fold_together(
    batches: Iterable[pa.RecordBatch], options: Mapping[str, str]
) -> Iterator[pa.RecordBatch]:
    """Fold one partition's records with each member's fold (``options["members"]``: JSON
    written by :func:`together`); each folded row carries its view's name."""
    records = list(batches)
    for spec in json.loads(options["members"]):
        fold = PartitionFold(spec["path"], tuple(sorted(spec["options"].items())))
        mine = [b for b in (past(r, spec["topics"], spec["skip"]) for r in records) if b.num_rows]
        if not mine:
            continue
        for out in fold.function()(iter(mine)):
            name = pa.array([spec["view"]] * out.num_rows, pa.string())
            yield pa.RecordBatch.from_arrays([*out.columns, name], schema=TOGETHER_SCHEMA)


def rows_of(table: pa.Table, view: str) -> pa.Table:
    """The folded rows of one member, without the view column."""
    mine = table.filter(pc.equal(table.column(VIEW_COLUMN), view))
    return mine.drop_columns([VIEW_COLUMN])
