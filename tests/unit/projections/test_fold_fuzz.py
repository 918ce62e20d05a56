"""Any bytes on a topic: the folds never fail. A record that is not a usable change or event
becomes a dead letter with a reason, everything else folds to at most one write per key, and
the good records fold the same with or without poison among them."""

import json
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.avro import SchemaCache, use_schemas
from connectors.schema_registry.memory import MemoryRegistry
from examples.social.views.folds import fold_profile
from projections.mirror import fold_changes
from projections.view import split_folded, writes_from_folded
from spark_streaming.kafka_reader import ARROW_SCHEMA
from tributary.view_model import write_table

TOPIC = "cdc.public.t"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


# Every strategy is built once, here: a strategy built inside a composite is built (and
# validated) again on every draw, which cost most of these tests' time.
OPS = st.sampled_from(["c", "u", "d", "r", "t", "x", None])
AFTERS = st.one_of(st.none(), st.dictionaries(st.sampled_from(["id", "v"]), json_values))
SOURCES = st.one_of(
    st.fixed_dictionaries({"lsn": st.integers(0, 10**6)}),
    st.fixed_dictionaries({"lsn": st.text(max_size=4)}),
    st.fixed_dictionaries({"sequence": st.text(max_size=10)}),
    json_values,
)
CHOICES = st.integers(0, 9)
GARBAGE = st.binary(max_size=40)


@st.composite
def envelopes(draw: Any) -> bytes | None:
    """Debezium-looking envelopes, some broken in every way a value can be."""
    choice = draw(CHOICES)
    if choice == 0:
        return None  # a tombstone
    if choice == 1:
        return draw(GARBAGE)
    if choice == 2:
        return json.dumps(draw(json_values)).encode()
    envelope: dict[str, Any] = {"op": draw(OPS), "after": draw(AFTERS), "source": draw(SOURCES)}
    text = json.dumps(envelope)
    if choice == 9:
        text = text.replace(",", ",\n", 1)  # a value spread over lines
    return text.encode()


ENVELOPES = envelopes()
LENGTHS = st.integers(1, 25)
KEYS = st.one_of(
    st.builds(lambda i: json.dumps({"id": i}).encode(), st.integers(0, 5)),
    st.none(),
    st.binary(max_size=6),
)
HEADERS = st.one_of(
    st.just([]),
    st.builds(lambda n: [{"key": "lsn", "value": str(n).encode()}], st.integers(0, 10**6)),
)


@st.composite
def records(draw: Any) -> list[dict[str, Any]]:
    out = []
    for offset in range(draw(LENGTHS)):
        key = draw(KEYS)
        value = draw(ENVELOPES)
        headers = draw(HEADERS)
        out.append(
            {
                "key": key,
                "value": value,
                "topic": TOPIC,
                "partition": 0,
                "offset": offset,
                "timestamp": None,
                "timestampType": 0,
                "headers": headers,
            }
        )
    return out


REGISTRY = "memory://fold-fuzz"
use_schemas(REGISTRY, SchemaCache(MemoryRegistry().schema_text))


def fold(function: Any, rows: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    table = pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)
    if function is fold_profile:
        batches = list(fold_profile(table.to_batches(), {"registry": REGISTRY}))
    else:
        batches = list(function(table.to_batches()))
    if not batches:
        return [], []
    return writes_from_folded(pa.Table.from_batches(batches))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records())
def test_the_mirror_fold_never_fails_and_dead_letters_what_it_cannot_use(
    rows: list[dict[str, Any]],
) -> None:
    writes, dead = fold(fold_changes, rows)
    assert len({(w.collection, w.key) for w in writes}) == len(writes)
    assert all(d.reason for d in dead)
    used = {(w.source.offset if w.source else -1) for w in writes}
    assert not used & {d.offset for d in dead}  # a dead letter never also became a write


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records(), st.integers(0, 3))
def test_poison_does_not_change_what_the_good_records_fold_to(
    rows: list[dict[str, Any]], where: int
) -> None:
    good = [
        {
            **r,
            "value": json.dumps(
                {"op": "u", "after": {"id": i % 3, "v": i}, "source": {"lsn": 100 + i}}
            ).encode(),
            "key": json.dumps({"id": i % 3}).encode(),
            "headers": [],
        }
        for i, r in enumerate(rows)
    ]
    poison = {**good[0], "value": b"\xff not json", "offset": 10_000}
    mixed = [*good[:where], poison, *good[where:]]
    for i, row in enumerate(mixed):
        row["offset"] = i
    clean_writes, _ = fold(fold_changes, good)
    mixed_writes, dead = fold(fold_changes, mixed)
    assert len(dead) == 1 and "not JSON" in dead[0].reason
    summary = lambda ws: {(w.key, w.position, tuple(getattr(w, "changes", ()))) for w in ws}  # noqa: E731
    assert summary(mixed_writes) == summary(clean_writes)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records())
def test_the_social_fold_never_fails_on_any_bytes(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        row["topic"] = "events.post"
    writes, dead = fold(fold_profile, rows)
    assert len({(w.collection, w.key) for w in writes}) == len(writes)
    assert all(d.reason for d in dead)


def _rows(table: Any) -> list[dict[str, Any]]:
    rows = table.to_pylist()
    for row in rows:
        if row["deleted"]:  # the stores read neither for a Delete (connectors/stores/writes.py)
            row["changes"], row["fresh"] = None, False
        elif row["changes"] in ([], [row["position"]]):
            row["changes"] = None  # null or empty: just the position
    return sorted(rows, key=lambda row: (row["collection"], row["key"]))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records(), st.lists(st.integers(0, 1), min_size=25, max_size=25))
def test_the_columnar_write_table_is_the_objects_write_table(
    rows: list[dict[str, Any]], partitions: list[int]
) -> None:
    """What the view job hands its stores (split_folded) is what the objects' path gives, keys
    folded in two partitions (a re-partitioned topic) merged by position as well."""
    for row, partition in zip(rows, partitions, strict=False):
        row["partition"] = partition
    folded = [
        pa.Table.from_batches(out)
        for part in (0, 1)
        if (chosen := [row for row in rows if row["partition"] == part])
        and (
            out := list(
                fold_changes(pa.Table.from_pylist(chosen, schema=ARROW_SCHEMA).to_batches())
            )
        )
    ]
    if not folded:
        return
    table = pa.concat_tables(folded)
    objects, dead = writes_from_folded(table)
    columns, dead_columns = split_folded(table)
    assert _rows(columns) == _rows(write_table(objects).select(columns.column_names))
    assert dead_columns == dead
