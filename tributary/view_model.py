"""What a view writes into a store, and what a store remembers of a view.

A view's micro-batch becomes a :class:`Batch`: keyed writes into named *collections* - the
columnar *write table* (:data:`WRITE_SCHEMA`, one row per write) or a sequence of
:class:`Put` / :class:`Delete` objects (:func:`write_table` turns them into the table) - the
batch id, and the Kafka offsets the batch reached. A store applies
the writes and records the batch in its ledger in one atomic unit, so a batch is applied once:

- **Ledger by offsets.** A batch whose end offsets the store already reached is skipped whole;
  a batch that would leave a gap (it starts past what the store reached) is refused.
- **Per-key position guard.** A write at or below the position the store holds for its key
  (the entry's, or the tombstone's of a deleted key) is dropped, so a re-sent record changes
  nothing and an old insert cannot bring back a deleted key.
- **Applied counts.** Each entry counts the source changes that built it since it was created;
  a change whose position the entry already passed is not counted again.
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # Arrow is imported by what builds or applies a write table, not by readers
    import pyarrow as pa  # type: ignore[import-untyped]

Offsets = dict[str, dict[str, int]]
"""Next offset per topic and partition (partition as a decimal string, as Spark writes it)."""


@dataclass(frozen=True)
class SourceRef:
    """Where the last record folded into a write came from (for dead letters)."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class Put:
    """Hold ``fields`` under ``key`` in ``collection``, if ``position`` is newer than the store's.

    ``changes`` are the positions of the source changes folded into this write, ascending
    (default: just ``position``); ``fresh`` says the entry was (re)created in this batch, so its
    applied count restarts.
    """

    collection: str
    key: str
    position: int
    fields: Mapping[str, Any]
    changes: tuple[int, ...] = ()
    fresh: bool = False
    source: SourceRef | None = None

    @property
    def folded(self) -> tuple[int, ...]:
        return self.changes or (self.position,)


@dataclass(frozen=True)
class Delete:
    """Remove ``key`` from ``collection`` (and remember ``position`` for it), if newer."""

    collection: str
    key: str
    position: int
    source: SourceRef | None = None


Write = Put | Delete


@dataclass(frozen=True)
class Entry:
    """What a store holds under one key of one collection."""

    collection: str
    key: str
    fields: dict[str, Any]
    position: int
    applied: int


@dataclass(frozen=True)
class Applied:
    """A write that passed the position guard, with the entry's fields before it (None: the
    key had no live entry)."""

    write: Write
    before: Mapping[str, Any] | None = None

    @property
    def existed(self) -> bool:
        return self.before is not None


@dataclass(frozen=True)
class Rejected:
    """A write the store could not hold (a value its schema refuses), and why."""

    write: Write
    reason: str


@dataclass(frozen=True)
class Commit:
    """A generation's ledger: the last batch applied and the offsets it reached."""

    view: str
    generation: str
    batch_id: int
    offsets: Offsets
    batches: int = 0

    @classmethod
    def empty(cls, view: str, generation: str) -> "Commit":
        return cls(view, generation, -1, {}, 0)


@dataclass(frozen=True)
class Batch:
    """One micro-batch of a view: writes, the batch id, and where the batch ends.

    ``writes`` is the write table (:data:`WRITE_SCHEMA`) or a sequence of Put/Delete objects.

    ``start`` is where the batch began (None: not known); a store refuses a batch whose start
    is past what it reached, because the records in between were never applied.
    """

    batch_id: int
    offsets: Offsets
    writes: "Sequence[Write] | pa.Table" = ()
    start: Offsets | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def covers(reached: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]]) -> bool:
    """Whether offsets ``reached`` are at or past ``end`` in every partition of ``end``."""
    for topic, parts in end.items():
        known = reached.get(topic, {})
        for partition, offset in parts.items():
            if known.get(partition, -1) < offset:
                return False
    return True


def gaps(
    reached: Mapping[str, Mapping[str, int]], start: Mapping[str, Mapping[str, int]]
) -> list[str]:
    """Partitions where ``start`` is past ``reached`` (records in between were never applied).

    A partition the store has not reached at all is not a gap: it starts wherever its log does.
    """
    problems = []
    for topic, parts in start.items():
        known = reached.get(topic, {})
        for partition, offset in parts.items():
            have = known.get(partition)
            if have is not None and offset > have:
                problems.append(f"{topic}[{partition}] starts at {offset}, store reached {have}")
    return problems


def merge_offsets(
    previous: Mapping[str, Mapping[str, int]], batch: Mapping[str, Mapping[str, int]]
) -> Offsets:
    """Offsets after a batch: the larger of the previous and the batch's, per partition."""
    merged = {topic: dict(parts) for topic, parts in previous.items()}
    for topic, parts in batch.items():
        target = merged.setdefault(topic, {})
        for partition, offset in parts.items():
            target[partition] = max(target.get(partition, 0), offset)
    return merged


def applied_count(stored_position: int | None, stored_applied: int, write: Put) -> int:
    """The entry's applied count after ``write`` (which already passed the guard).

    Only changes above the stored position count; a fresh write whose first change is new
    restarts the count (the entry was recreated).
    """
    floor = -1 if stored_position is None else stored_position
    new = [p for p in write.folded if p > floor]
    if write.fresh and write.folded[0] > floor:
        return len(new)
    return stored_applied + len(new)


def check_unique(writes: Sequence[Write]) -> None:
    """A batch holds at most one write per key of a collection (the fold folds per key)."""
    seen: set[tuple[str, str]] = set()
    for write in writes:
        ident = (write.collection, write.key)
        if ident in seen:
            raise ValueError(f"two writes for {write.collection}/{write.key} in one batch")
        seen.add(ident)


class JsonObject(Mapping[str, Any]):
    """A JSON object kept as its text, parsed only when a field is read.

    Folds on Spark's executors hand their rows over as JSON text; a store that can take the
    text as is (PostgreSQL's ``jsonb``) never parses it in Python.
    """

    __slots__ = ("_parsed", "member", "text")

    def __init__(self, text: str, member: str | None = None) -> None:
        self.text = text
        self.member = member  # the fields are this member of the document (None: all of it)
        self._parsed: dict[str, Any] | None = None

    def _object(self) -> dict[str, Any]:
        if self._parsed is None:
            value = json.loads(self.text)
            if self.member is not None and isinstance(value, dict):
                value = value.get(self.member)
            if not isinstance(value, dict):
                raise ValueError(f"fields must be a JSON object, got {self.text[:80]!r}")
            self._parsed = value
        return self._parsed

    def __getitem__(self, key: str) -> Any:
        return self._object()[key]

    def __iter__(self) -> Any:
        return iter(self._object())

    def __len__(self) -> int:
        return len(self._object())

    def __repr__(self) -> str:
        return f"JsonObject({self.text!r}, member={self.member!r})"


def fields_json(fields: Mapping[str, Any]) -> str:
    """The fields as JSON text (kept as is when they arrived as text)."""
    if isinstance(fields, JsonObject) and fields.member is None:
        return fields.text
    return json.dumps(dict(fields), separators=(",", ":"), default=str)


# -- the write table ------------------------------------------------------------------------

WRITE_COLUMNS = (
    "collection",
    "key",
    "position",
    "deleted",
    "fields",
    "member",
    "changes",
    "fresh",
    "topic",
    "partition",
    "offset",
)
"""The names of the write table's columns, in order (:func:`write_schema`)."""


@cache
def write_schema() -> "pa.Schema":
    """The write table's schema (also ``WRITE_SCHEMA``), built at first use: importing Arrow
    costs ~0.15 s, which a command that only reads a store does not pay.

    A batch's writes as columns, one row per write:

    - ``collection``, ``key``: where it goes; ``position``: the key's new position; ``deleted``: a
      Delete (else a Put);
    - ``fields``: JSON text of the entry's fields, or of a larger document whose member ``member``
      holds them (null for a Delete); ``changes``: the positions folded in, ascending (null or
      empty: just ``position``); ``fresh``: the entry was (re)created in this batch;
    - ``topic``, ``partition``, ``offset``: the last source record folded in (for dead letters;
      null when unknown).

    It is :data:`projections.folding.FOLDED_SCHEMA` without the rejection columns.
    """
    import pyarrow as pa

    return pa.schema(
        [
            ("collection", pa.string()),
            ("key", pa.string()),
            ("position", pa.int64()),
            ("deleted", pa.bool_()),
            ("fields", pa.string()),
            ("member", pa.string()),
            ("changes", pa.list_(pa.int64())),
            ("fresh", pa.bool_()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
        ]
    )


def __getattr__(name: str) -> Any:  # PEP 562: `WRITE_SCHEMA`, built at first use
    if name == "WRITE_SCHEMA":
        return write_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def write_table(writes: Sequence[Write]) -> "pa.Table":
    """Put/Delete objects as the write table (fields kept as their JSON text)."""
    import pyarrow as pa

    columns: dict[str, list[Any]] = {name: [] for name in WRITE_COLUMNS}
    for write in writes:
        columns["collection"].append(write.collection)
        columns["key"].append(write.key)
        columns["position"].append(write.position)
        source = write.source
        columns["topic"].append(None if source is None else source.topic)
        columns["partition"].append(None if source is None else source.partition)
        columns["offset"].append(None if source is None else source.offset)
        if isinstance(write, Put):
            fields = write.fields
            if isinstance(fields, JsonObject):
                text, member = fields.text, fields.member
            else:
                text, member = fields_json(fields), None
            columns["deleted"].append(False)
            columns["fields"].append(text)
            columns["member"].append(member)
            columns["changes"].append(list(write.changes) or None)
            columns["fresh"].append(write.fresh)
        else:
            columns["deleted"].append(True)
            columns["fields"].append(None)
            columns["member"].append(None)
            columns["changes"].append(None)
            columns["fresh"].append(False)
    return pa.table(columns, schema=write_schema())


def lookup_text(value: Any) -> str | None:
    """The text a lookup compares (what PostgreSQL's ``fields ->> name`` gives; None: null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)
