"""A view of ``items`` whose producer moved to a new record shape, and the same view fixed.

Records on ``items.<views schema>`` (key = the item id): shape 1 ``{"id", "name", "version"}``
and, from a newer producer, shape 2 ``{"shape": 2, "id", "label", "version"}``. The first
release of the view knows only shape 1 and dead-letters shape 2 ("unknown shape"); the fixed
release upcasts shape 2 to shape 1. Both write ``items`` (key = the id, position = the
version) to the same Redis store, so the fixed view resumes where the first stopped.

Named by the settings (``TRIBUTARY_VIEWS=tests.integration.operations.legacy_views:strict``
or ``:fixed``), like any view factory; the topic and the view's name are derived from the
test's views schema, so each test has its own.
"""

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from connectors.stores.redis import RedisStore
from projections.folding import emit, folded_batch, records_table, rejections
from projections.view import View, per_partition
from tributary.view_store import Collection
from views.catalog import ViewsConfig

ITEMS = "items"


def names(config: ViewsConfig) -> tuple[str, str]:
    """The view's name and topic for this config's views schema."""
    return f"items_{config.views_schema}", f"items.{config.views_schema}"


def upcast(record: dict[str, Any]) -> dict[str, Any]:
    """Shape 2 -> shape 1 (``label`` was ``name``)."""
    if record.get("shape") == 2:
        return {"id": record["id"], "name": record["label"], "version": record["version"]}
    return record


def fold(batches: Iterable[pa.RecordBatch], *, fixed: bool) -> Iterator[pa.RecordBatch]:
    table = records_table(batches)
    if table.num_rows == 0:
        return
    values = table.column("value").to_pylist()
    latest: dict[str, tuple[int, dict[str, Any], int]] = {}  # key -> (version, fields, row)
    reasons: dict[int, str] = {}
    for row, value in enumerate(values):
        try:
            record = json.loads(value)
            if record.get("shape", 1) != 1:
                if not fixed:
                    raise ValueError(f"unknown shape {record['shape']}")
                record = upcast(record)
            key, version = str(int(record["id"])), int(record["version"])
            fields = {"id": int(record["id"]), "name": str(record["name"])}
        except (ValueError, KeyError, TypeError) as exc:
            reasons[row] = f"not an item: {exc}"
            continue
        if key not in latest or version > latest[key][0]:
            latest[key] = (version, fields, row)
    items = sorted(latest.items())
    rows = pa.array([row for _, (_, _, row) in items], pa.int64())
    written = folded_batch(
        {
            "collection": [ITEMS] * len(items),
            "key": [key for key, _ in items],
            "position": [version for _, (version, _, _) in items],
            "deleted": [False] * len(items),
            "fields": [json.dumps(fields) for _, (_, fields, _) in items],
            "changes": [[version] for _, (version, _, _) in items],
            "fresh": [False] * len(items),
            "topic": table.column("topic").take(rows),
            "partition": table.column("partition").take(rows),
            "offset": table.column("offset").take(rows),
        },
        len(items),
    )
    yield from emit([written, rejections(table, reasons)])


def fold_strict(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    return fold(batches, fixed=False)


def fold_fixed(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    return fold(batches, fixed=True)


def _view(config: ViewsConfig, function: str) -> View:
    name, topic = names(config)
    return View(
        name=name,
        topics=(topic,),
        fold=per_partition(f"tests.integration.operations.legacy_views:{function}"),
        store=RedisStore(config.redis_url, name, [Collection(ITEMS)]),
        description="items by id (Redis)",
    )


def strict(config: ViewsConfig) -> Sequence[View]:
    """The first release: shape 2 is a dead letter."""
    return [_view(config, "fold_strict")]


def fixed(config: ViewsConfig) -> Sequence[View]:
    """The fixed release: shape 2 upcast."""
    return [_view(config, "fold_fixed")]
