"""The mirror sink on a real PostgreSQL: batch ids and per-key positions (no Spark)."""

from collections.abc import Iterator

import psycopg
import pytest

from projections.mirror import MirrorWrite
from projections.mirror_sink import PostgresMirrorSink
from projections.mirror_table import MirrorTable
from projections.mirror_target import MirrorTarget
from tests.integration.conftest import Endpoints

Rows = dict[int, tuple[object, ...]]


@pytest.fixture
def target(stack: Endpoints, views_schema: str) -> MirrorTarget:
    return MirrorTarget(
        stack.postgres_dsn, "mirror.public.t", MirrorTable(views_schema, "public_t")
    )


@pytest.fixture
def sink(target: MirrorTarget) -> Iterator[PostgresMirrorSink]:
    out = target.sink(target.live_generation(), live=True)
    yield out
    out.close()


def rows(dsn: str, target: MirrorTarget) -> Rows:
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            f"SELECT id, name, _position, _applied_count FROM {target.table.qualified} ORDER BY id"
        ).fetchall()
    return {int(r[0]): (r[1], r[2], r[3]) for r in found}


def upsert(
    key: int, name: str, pos: int, fresh: bool = False, applied: list[int] | None = None
) -> MirrorWrite:
    return MirrorWrite({"id": key}, {"id": key, "name": name}, pos, fresh, applied or [pos])


def test_a_batch_id_already_recorded_is_skipped_whole(
    stack: Endpoints, sink: PostgresMirrorSink, target: MirrorTarget
) -> None:
    assert sink.apply(0, [upsert(1, "a", 10, fresh=True)], {"t": {"0": 1}})
    assert sink.apply(1, [upsert(1, "b", 11)], {"t": {"0": 2}})
    # Spark re-runs batch 1 after a crash (same data): nothing changes, not even the counter.
    assert not sink.apply(1, [upsert(1, "b", 11)], {"t": {"0": 2}})
    assert rows(stack.postgres_dsn, target) == {1: ("b", 11, 2)}


def test_positions_at_or_below_the_last_change_nothing(
    stack: Endpoints, sink: PostgresMirrorSink, target: MirrorTarget
) -> None:
    sink.apply(0, [upsert(1, "a", 10, fresh=True), upsert(2, "x", 12, fresh=True)], {})
    sink.apply(1, [upsert(1, "b", 20), MirrorWrite({"id": 2}, None, 30)], {})
    # Re-sent old records in later batches: an old update, an old insert of the deleted key.
    sink.apply(2, [upsert(1, "old", 15), upsert(2, "x", 12, fresh=True)], {})
    sink.apply(3, [upsert(1, "old", 20, applied=[10, 20])], {})
    assert rows(stack.postgres_dsn, target) == {1: ("b", 20, 2)}
    # A newer insert of the deleted key comes back with its count restarted.
    sink.apply(4, [upsert(2, "y", 31, fresh=True, applied=[31, 32])], {})
    assert rows(stack.postgres_dsn, target)[2] == ("y", 31, 2)


def test_new_columns_are_added_as_they_appear(
    stack: Endpoints, sink: PostgresMirrorSink, target: MirrorTarget
) -> None:
    sink.apply(0, [MirrorWrite({"id": 1}, {"id": 1, "name": "a", "note": None}, 5, True, [5])], {})
    sink.apply(
        1,
        [MirrorWrite({"id": 2}, {"id": 2, "name": "b", "note": "hi", "n": 1.5}, 6, True, [6])],
        {},
    )
    with psycopg.connect(stack.postgres_dsn) as conn:
        got = conn.execute(
            f"SELECT id, note, n FROM {target.table.qualified} ORDER BY id"
        ).fetchall()
    assert [(int(a), b, c and float(c)) for a, b, c in got] == [(1, None, None), (2, "hi", 1.5)]
