"""Generated Debezium change envelopes on ``cdc.public.users``, fed to the fold of every view
that reads change topics (the mirror, the search index, the profile cache) and to the record
decoder of subscribers and ``tributary verify``: valid changes of every kind (inserts, updates,
snapshot reads, incremental-snapshot reads, deletes, tombstones, huge rows, rows with unusual
field types) mixed with poison (bytes that are not JSON, Avro-looking bytes, JSON that is not
an object, missing or wrong op, source, lsn, after, keys that name no user, no key at all).

Every poison record becomes a dead letter with a reason, carrying the record unchanged; no
valid record does; and the valid records fold to the same writes as they do without poison,
which are the latest valid change per key (the views converge on the valid ones).
"""

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.avro import SchemaCache, use_schemas
from connectors.schema_registry.memory import MemoryRegistry
from examples.social.views.folds import fold_profile, fold_search, fold_timeline
from projections.mirror import fold_changes
from projections.view import DeadLetter, writes_from_folded
from spark_streaming.kafka_reader import ARROW_SCHEMA
from tributary.changes import ChangeDecodeError, ChangeEvent
from tributary.view_model import Delete, Put, Write

TOPIC = "cdc.public.users"
REGISTRY = {"registry": "memory://change-fuzz"}  # an empty registry: Avro-looking poison
use_schemas(REGISTRY["registry"], SchemaCache(MemoryRegistry().schema_text))


@dataclass(frozen=True)
class Change:
    """A generated record and what it means: ``put``/``delete`` of user ``user`` at ``lsn``
    (``after``: the row), ``ignored`` (a tombstone without position) or ``poison``."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    meaning: str
    user: int = 0
    lsn: int = 0
    after: dict[str, Any] | None = None
    social_only: bool = False  # poison only for the social folds (no user id, text not text)


texts = st.text(max_size=12)
odd_values = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
lsns = st.integers(1, 10**12)
# Every strategy is built once, at module level: one built inside a composite is built (and
# validated) again on every draw, which cost most of these tests' time.
maybe_texts = st.none() | texts
users = st.integers(1, 6)
NO_USER_KEYS = [
    *(b"{}", b'{"id": null}', b'{"id": "7"}', b'{"id": 1.5}', b'{"id": true}'),
    *(b'{"id": [1]}', b'{"user": 3}', json.dumps({"id": 2**64}).encode()),
]


def key_of(user: int) -> bytes:
    return json.dumps({"id": user}).encode()


def envelope(op: Any, after: Any, source: Any, **more: Any) -> bytes:
    return json.dumps({"before": None, "after": after, "op": op, "source": source, **more}).encode()


ROW_SHAPES = st.integers(0, 9)
HUGE_SIZES = st.sampled_from([10_000, 200_000])
TEXT_COLUMNS = st.sampled_from(["handle", "display_name", "bio"])


@st.composite
def user_fields(draw: Any) -> dict[str, Any]:
    """A user row but its id (``{"id": user, **fields}`` is the row)."""
    row: dict[str, Any] = {
        "handle": draw(texts),
        "display_name": draw(maybe_texts),
        "bio": draw(maybe_texts),
        "updated_at": "2026-01-01T00:00:00Z",
    }
    shape = draw(ROW_SHAPES)
    if shape == 0:
        row["bio"] = "b" * draw(HUGE_SIZES)  # a huge row
    elif shape == 1:  # a text column that is not text: the mirror's table decides
        row[draw(TEXT_COLUMNS)] = draw(odd_values)
    elif shape == 2:
        row["extra"] = draw(odd_values)  # a column the view does not know
    return row


USER_FIELDS = user_fields()


def untyped(row: dict[str, Any]) -> bool:
    """Whether a user row has a handle, display name or bio that is not text."""
    return any(not isinstance(row[n], str | None) for n in ("handle", "display_name", "bio"))


CHANGE_KINDS = st.sampled_from(["c", "u", "r", "incremental", "d"])
TOMBSTONES = st.sampled_from(["none", "with lsn", "without lsn"])


@st.composite
def valid_changes(draw: Any) -> list[Change]:
    user = draw(users)
    lsn = draw(lsns)
    header = (("lsn", str(lsn).encode()),)
    kind = draw(CHANGE_KINDS)
    if kind == "d":
        value = envelope("d", None, {"lsn": lsn}, before={"id": user})
        out = [Change(key_of(user), value, header, "delete", user, lsn)]
        tombstone = draw(TOMBSTONES)
        if tombstone == "with lsn":
            out.append(Change(key_of(user), None, header, "delete", user, lsn))
        elif tombstone == "without lsn":
            out.append(Change(key_of(user), None, (), "ignored"))
        return out
    row = {"id": user, **draw(USER_FIELDS)}
    if kind == "incremental":  # incremental-snapshot reads carry [lastCommitLsn, lsn]
        source: dict[str, Any] = {"sequence": json.dumps([str(max(lsn - 7, 0)), str(lsn)])}
        value = envelope("r", row, source)
    else:
        source = {"lsn": lsn, "txId": lsn // 2, "schema": "public", "table": "users", "ts_ms": 0}
        value = envelope(kind, row, source, ts_ms=0)
    return [Change(key_of(user), value, header, "put", user, lsn, row, untyped(row))]


def not_a_json_object(raw: bytes) -> bool:
    try:
        return not isinstance(json.loads(raw), dict)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return True


POISON_KINDS = st.integers(0, 15)
AVRO_TAILS = st.binary(max_size=20)
NOT_JSON_OBJECTS = st.binary(min_size=1, max_size=30).filter(not_a_json_object)
JSON_NOT_OBJECTS = st.none() | st.integers() | st.lists(st.integers())
BAD_OPS = st.sampled_from([None, "x", "", "t", "m", 5, ["c"]])
BAD_SOURCES = st.sampled_from([None, "x", 5, [1], {}, {"lsn": None}])
BAD_LSNS = st.sampled_from(["abc", "1.5", 1.5, True, 2**64, -(2**64), [1], {"a": 1}])
BAD_SEQUENCES = st.sampled_from(["nope", "[]", "{}", "5"])
ROW_OPS = st.sampled_from(["c", "u", "r"])
BAD_AFTERS = st.sampled_from([[1], 5, "row", True])
BAD_KEYS = st.sampled_from([b"", b"nope", b"[1]", b"7", b"\x00\x01", b'{"id": 1'])
NO_USER_KEY_CHOICES = st.sampled_from(NO_USER_KEYS)


@st.composite
def poison(draw: Any) -> Change:
    user = draw(users)
    good_source = {"lsn": draw(lsns)}
    row = {"id": user, "handle": "h"}
    kind = draw(POISON_KINDS)
    key: bytes | None = key_of(user)
    if kind == 0:
        value = b"\x00\x00\x00\x00\x01" + draw(AVRO_TAILS)  # Avro-looking bytes
    elif kind == 1:
        value = draw(NOT_JSON_OBJECTS)
    elif kind == 2:
        value = json.dumps(draw(JSON_NOT_OBJECTS)).encode()
    elif kind == 3:
        whole = envelope("c", row, good_source)
        value = whole[: draw(st.integers(0, len(whole) - 1))] or b" "  # cut short
    elif kind == 4:
        value = envelope(draw(BAD_OPS), row, good_source)
    elif kind == 5:
        value = envelope("c", row, draw(BAD_SOURCES))
    elif kind == 6:
        value = envelope("u", row, {"lsn": draw(BAD_LSNS)})
    elif kind == 7:
        value = envelope("c", row, {"sequence": draw(BAD_SEQUENCES)})
    elif kind == 8:
        value = envelope(draw(ROW_OPS), None, good_source)
    elif kind == 9:
        value = envelope("u", draw(BAD_AFTERS), good_source)
    elif kind == 10:
        key, value = None, envelope("c", row, good_source)
    elif kind == 11:
        key, value = None, None  # a tombstone without a key
    elif kind == 12:
        key = draw(BAD_KEYS)
        value = envelope("c", row, good_source)
    elif kind == 13:
        value = b"x" * 300_000  # huge and not JSON
    else:  # keys that are JSON objects but name no user: poison for the social folds only
        key = draw(NO_USER_KEY_CHOICES)
        value = envelope("c", {**row, "id": 0}, good_source)
        return Change(key, value, (), "poison", social_only=True)
    return Change(key, value, (), "poison")


VALID_CHANGES = valid_changes()
POISON = poison()
POISON_FOR_EVERY_FOLD = POISON.filter(lambda c: not c.social_only)
VALID_COUNTS = st.integers(0, 12)
POISON_COUNTS = st.integers(1, 6)


@st.composite
def streams(draw: Any, with_key_poison: bool = True) -> list[Change]:
    """A partition's records: valid changes with poison interleaved (at least one poison)."""
    out: list[Change] = []
    for _ in range(draw(VALID_COUNTS)):
        out += draw(VALID_CHANGES)
    for _ in range(draw(POISON_COUNTS)):
        bad = draw(POISON if with_key_poison else POISON_FOR_EVERY_FOLD)
        out.insert(draw(st.integers(0, len(out))), bad)
    return out


def records(changes: list[Change]) -> list[dict[str, Any]]:
    return [
        {
            "key": c.key,
            "value": c.value,
            "topic": TOPIC,
            "partition": 0,
            "offset": offset,
            "timestamp": None,
            "timestampType": 0,
            "headers": [{"key": k, "value": v} for k, v in c.headers],
        }
        for offset, c in enumerate(changes)
    ]


def fold(function: Any, rows: list[dict[str, Any]]) -> tuple[list[Write], list[DeadLetter]]:
    table = pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)
    if function is fold_changes:
        batches = list(function(table.to_batches()))
    else:
        batches = list(function(table.to_batches(), REGISTRY))
    if not batches:
        return [], []
    return writes_from_folded(pa.Table.from_batches(batches))


def summary(writes: list[Write]) -> set[tuple[Any, ...]]:
    out: set[tuple[Any, ...]] = set()
    for w in writes:
        if isinstance(w, Put):
            fields = json.dumps(dict(w.fields), sort_keys=True)
            out.add((w.collection, w.key, w.position, fields, w.changes, w.fresh))
        else:
            out.add((w.collection, w.key, w.position, "deleted"))
    return out


def reference(changes: list[Change]) -> dict[int, dict[str, Any] | None]:
    """The latest valid change per user (by lsn, then offset): its row, or None if deleted."""
    latest: dict[int, tuple[int, int, dict[str, Any] | None]] = {}
    for offset, c in enumerate(changes):
        if c.meaning in ("put", "delete"):
            now = (c.lsn, offset, c.after if c.meaning == "put" else None)
            if c.user not in latest or now[:2] > latest[c.user][:2]:
                latest[c.user] = now
    return {user: row for user, (_, _, row) in latest.items()}


def held(writes: list[Write], collection: str, key: Any) -> dict[Any, dict[str, Any] | None]:
    out: dict[Any, dict[str, Any] | None] = {}
    for w in writes:
        assert w.collection == collection
        if isinstance(w, Delete):
            out[key(w.key)] = None
        else:
            out[key(w.key)] = dict(w.fields)
    return out


def check(function: Any, changes: list[Change], collection: str, key: Any, social: bool) -> None:
    rows = records(changes)
    writes, dead = fold(function, rows)
    bad = {o for o, c in enumerate(changes) if c.meaning == "poison" or (social and c.social_only)}
    # A tombstone without a key may also be skipped: in a partition whose values are mostly
    # in the events' wire format, tombstones mean nothing (events are never deleted).
    skippable = {o for o in bad if changes[o].value is None}
    letters = {d.offset for d in dead}
    assert bad - skippable <= letters <= bad, [(d.offset, d.reason) for d in dead]
    for letter in dead:
        assert letter.reason and letter.stage == "decode" and letter.topic == TOPIC
        assert (letter.key, letter.value) == (
            rows[letter.offset]["key"],
            rows[letter.offset]["value"],
        )
    clean = [c for o, c in enumerate(changes) if o not in bad]
    clean_rows = [r for o, r in enumerate(rows) if o not in bad]
    clean_writes, clean_dead = fold(function, clean_rows)
    assert clean_dead == []
    assert summary(writes) == summary(clean_writes)
    assert len({(w.collection, w.key) for w in writes}) == len(writes)
    assert held(writes, collection, key) == reference(clean)


SOCIAL_FOLDS = [fold_search, fold_profile]


@pytest.mark.parametrize("function", SOCIAL_FOLDS, ids=lambda f: f.__name__)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=streams())
def test_social_views_dead_letter_poison_changes_and_converge_on_the_valid_ones(
    function: Any, changes: list[Change]
) -> None:
    check(function, changes, "users", int, social=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=streams(with_key_poison=False))
def test_the_mirror_dead_letters_poison_changes_and_converges_on_the_valid_ones(
    changes: list[Change],
) -> None:
    check(fold_changes, changes, "rows", lambda k: json.loads(k)["id"], social=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=streams())
def test_the_timeline_writes_nothing_from_changes_and_never_fails_on_them(
    changes: list[Change],
) -> None:
    """The timeline reads no change topic; fed one, it writes nothing and never fails (what it
    cannot read as events is dead-lettered with a reason)."""
    writes, dead = fold(fold_timeline, records(changes))
    assert writes == [] and all(d.reason for d in dead)


@settings(max_examples=300, deadline=None)
@given(changes=streams(with_key_poison=False))
def test_the_record_decoder_refuses_poison_with_a_reason_and_reads_the_rest(
    changes: list[Change],
) -> None:
    """``ChangeEvent.from_kafka`` (subscribers, ``tributary verify``) raises only
    ``ChangeDecodeError`` for poison, and reads every valid change's op, row and position."""
    for c in changes:
        try:
            event = ChangeEvent.from_kafka(TOPIC, c.key, c.value, list(c.headers))
        except ChangeDecodeError as exc:
            assert str(exc)
            assert c.meaning == "poison", (c, exc)
            continue
        if c.meaning in ("put", "delete") and c.value is not None:
            assert event.position == c.lsn and event.key == {"id": c.user}
            assert event.after == c.after
        elif c.meaning == "poison":  # read by the decoder, refused by the folds
            assert event.op in ("t", "m") or event.after is None, c


def poison_samples(user: int) -> list[tuple[bytes | None, bytes | None, str]]:
    """One poison record of each kind for user ``user`` (key, value, a word of the reason),
    for the test that sends them through a real view job."""
    row = {"id": user, "handle": "poison"}
    source = {"lsn": 10**12}
    return [
        (key_of(user), b"\x00\x7f\xff\xff\xffavro-looking", "not a readable event"),
        (key_of(user), b"not json at all", "not JSON"),
        (key_of(user), b"[1, 2]", "not a JSON object"),
        (key_of(user), envelope("x", row, source), "no valid op"),
        (key_of(user), envelope("c", row, {"lsn": "abc"}), "not an integer"),
        (key_of(user), envelope("u", None, source), "without an 'after' row"),
        (key_of(user), envelope("u", {**row, "handle": {"a": 1}}, source), "not a string"),
        (b'{"id": "seven"}', envelope("c", row, source), "not an integer"),
        (None, envelope("c", row, source), "without a key"),
    ]
