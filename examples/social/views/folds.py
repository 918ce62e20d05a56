"""What the social views read from Kafka, folded per partition into entity writes.

Three inputs, three entity collections (each view keeps the ones it needs):

- ``cdc.public.users`` (Debezium changes of the CRUD table) -> ``users``: key = the user id,
  fields = the row (``after``), position = the LSN; deletes remove the user;
- ``events.post`` -> ``posts``: key = the post id, fields = the post (author, text, hashtags,
  creation and edit time), position = the stream version; ``PostDeleted`` removes it;
- ``events.follows`` -> ``follows``: key = ``<follower>:<followee>``, fields = both ids,
  position = the version of the follower's stream; ``UserUnfollowed`` removes the edge;
- ``events.subject`` -> ``forgotten``: key = ``<type>:<id>`` of each ``SubjectForgotten``,
  which each view's materializer purges the subject on.

Personal fields (a post's text) arrive encrypted: the fold reads the keys of the subjects a
partition's batch needs from the event store's key table once (options ``keys_dsn``,
``keys_schema``) and decrypts; an event that names a forgotten user (author, follower or
followee) folds into a removal, so a replay from offset zero never brings the user back.

Every record of a key lives in one partition (keyed topics), so each partition folds alone,
on an executor. Users are folded columnar (the mirror's fold); events are Avro-decoded one by
one (no columnar Avro reader here; Confluent wire format, writer schemas fetched once by id from
the schema registry the fold's ``registry`` option names) and folded per key to the newest
version.
"""

import contextlib
import io
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.json as pj  # type: ignore[import-untyped]
from pydantic_core import to_jsonable_python

from connectors.avro import MAGIC, SchemaCache, event_parts, registry_schemas
from connectors.schema_registry.errors import RegistryUnavailableError
from event_store.event import Position, RecordedEvent
from event_store.personal import (
    KeyReader,
    Subject,
    decrypt_data,
    personal_of_schema,
    plain_types_of_schema,
    subjects,
)
from examples.social.posts import POST_UPCASTERS
from examples.social.views.entities import FOLLOWS, FORGOTTEN, POSTS, USER, USERS
from projections.folding import emit, folded_batch, parse_json, records_table, rejections
from projections.mirror import fold_changes

Options = Mapping[str, str]


def fold_search(batches: Iterable[pa.RecordBatch], options: Options) -> Iterator[pa.RecordBatch]:
    """The search index's inputs: users and posts (and forgotten subjects)."""
    return fold_entities(batches, {USERS, POSTS, FORGOTTEN}, options)


def fold_profile(batches: Iterable[pa.RecordBatch], options: Options) -> Iterator[pa.RecordBatch]:
    """The profile cache's inputs: users, posts and follows (and forgotten subjects)."""
    return fold_entities(batches, {USERS, POSTS, FOLLOWS, FORGOTTEN}, options)


def fold_timeline(batches: Iterable[pa.RecordBatch], options: Options) -> Iterator[pa.RecordBatch]:
    """The home timeline's inputs: posts and follows (and forgotten subjects)."""
    return fold_entities(batches, {POSTS, FOLLOWS, FORGOTTEN}, options)


def fold_entities(
    batches: Iterable[pa.RecordBatch], wanted: set[str], options: Options
) -> Iterator[pa.RecordBatch]:
    """Fold one partition's records into entity writes of the ``wanted`` collections
    (``options["registry"]``: the schema registry's URL)."""
    table = records_table(batches)
    if table.num_rows == 0:
        return
    topics = table.column("topic").unique().to_pylist()
    for topic in topics:
        part = table.filter(pc.equal(table.column("topic"), topic)) if len(topics) > 1 else table
        yield from emit(_fold_topic(part, wanted, options))


def _fold_topic(part: pa.Table, wanted: set[str], options: Options) -> list[pa.RecordBatch | None]:
    """One topic's records of the partition. Event topics hold Confluent wire-format records
    (byte 0), CDC topics JSON: each record is read by its own format, so poison of the other
    kind, however much of it, is a dead letter and never turns the good records into dead
    letters. A tombstone is a delete on a CDC topic; on an event topic (most values in wire
    format) it means nothing, as events are never deleted."""
    values = part.column("value").combine_chunks()
    present = pc.is_valid(values).to_numpy(zero_copy_only=False)
    first = pc.binary_slice(values.cast(pa.binary()), 0, 1)
    magic = pc.fill_null(pc.equal(first, pa.scalar(MAGIC, pa.binary())), False)
    is_event = np.asarray(magic.to_numpy(zero_copy_only=False), dtype=bool)
    event_topic = 2 * int(is_event.sum()) > int(present.sum())
    out: list[pa.RecordBatch | None] = []
    if is_event.any():
        events = part.filter(pa.array(is_event))
        out += _fold_events(
            events, wanted, registry_schemas(options["registry"]), key_lookup(options)
        )
    other = ~is_event & (present | (not event_topic))
    if not other.any():
        return out
    rest = part.filter(pa.array(other))
    if USERS in wanted:
        out += _fold_users(rest)
    elif event_topic:
        reason = "not a readable event: not in Confluent wire format (magic byte 0)"
        out.append(rejections(rest, dict.fromkeys(range(rest.num_rows), reason)))
    return out


USER_KEY = pa.schema([("id", pa.int64())])
USER_ROW = pa.schema(
    [("after", pa.struct([(name, pa.string()) for name in ("handle", "display_name", "bio")]))]
)


def _fold_users(part: pa.Table) -> list[pa.RecordBatch | None]:
    """Users changes folded by the mirror's fold, keyed by the bare user id. A record whose key
    has no integer ``id`` (it names no user), or whose row's handle, display name or bio is
    not text (the views index and show them as text), is a dead letter."""
    keys = part.column("key").combine_chunks()
    parsed, bad = parse_json(keys, USER_KEY)
    reasons = {row: f"key {reason}" for row, reason in bad.items()}
    _, bad_rows = parse_json(part.column("value").combine_chunks(), USER_ROW)
    for row, reason in bad_rows.items():
        reasons.setdefault(row, f"value {reason}")
    if parsed is not None:
        ids = parsed.column("id").combine_chunks()
        named = pc.is_valid(keys).to_numpy(zero_copy_only=False)
        for row in map(
            int, np.flatnonzero(named & ~pc.is_valid(ids).to_numpy(zero_copy_only=False))
        ):
            reasons.setdefault(row, "key has no integer 'id' (the users table's primary key)")
    usable = part
    if reasons:
        keep = np.ones(part.num_rows, dtype=bool)
        keep[list(reasons)] = False
        usable = part.filter(pa.array(keep))
    folded = [_rekey_users(b) for b in fold_changes(usable.to_batches(), USERS)]
    return [*folded, rejections(part, reasons)]


def _rekey_users(batch: pa.RecordBatch) -> pa.RecordBatch:
    """User entries are keyed by the bare id (``7``), as posts and follows name their users
    (every key here has an integer ``id``: :func:`_fold_users` checked)."""
    keys = batch.column("key")
    if keys.null_count == len(keys):
        return batch  # rejections only
    present = pc.is_valid(keys)
    text = b"\n".join(k.encode() for k in keys.filter(present).to_pylist())
    ids = pj.read_json(
        io.BytesIO(text),
        parse_options=pj.ParseOptions(explicit_schema=USER_KEY, unexpected_field_behavior="ignore"),
    ).column("id")
    it = iter(ids.to_pylist())
    rekeyed = [None if not ok else str(next(it)) for ok in present.to_pylist()]
    index = batch.schema.get_field_index("key")
    return batch.set_column(index, "key", pa.array(rekeyed, pa.string()))


@dataclass
class _Folded:
    collection: str
    key: str
    position: int
    fields: dict[str, Any] | None  # None: deleted
    changes: list[int] = field(default_factory=list)
    fresh: bool = False
    row: int = 0


def decode_event(value: bytes, schemas: SchemaCache) -> dict[str, Any]:
    """An event record's envelope (``event_id``, ``version``, ``occurred_at``, ...) with its
    data in JSON form (ISO-8601 times, as the store keeps it), upcast to the current shape;
    personal fields still encrypted (their tokens), named with their subjects in
    ``personal`` (from the writer schema's ``tributary.personal`` properties)."""
    schema, record = schemas.decode(value)
    parts = event_parts(record)
    meta = parts.meta
    recorded = RecordedEvent(
        meta["event_id"],
        meta["stream_id"],
        meta["stream_type"],
        int(meta["version"]),
        parts.event_type,
        parts.schema_version,
        to_jsonable_python(parts.data),
        {},
        datetime.now(UTC),
        Position(0, 0),
    )
    current = POST_UPCASTERS.upcast(recorded)
    marks = personal_of_schema(schema.definition) if parts.typed else {}
    return {
        **meta,
        "event_type": current.event_type,
        "data": dict(current.data),
        "personal": marks,
        "plain_types": plain_types_of_schema(schema.definition) if marks else {},
    }


#: Fields of the social events that name a user: an event naming a forgotten user folds
#: into a removal (its post or follow edge), so no replay brings the user back.
USER_FIELDS = ("author_id", "follower_id", "followee_id")


def open_event(event: dict[str, Any], keys: Mapping[Subject, bytes | None]) -> dict[str, Any]:
    """The event with its personal fields decrypted (redacted where the key is gone), and
    ``forgotten``: whether it names a forgotten user."""
    data = event["data"]
    if event["personal"]:
        data = decrypt_data(event["personal"], data, keys, event["plain_types"])
    forgotten = any(
        data.get(name) is not None
        and (USER, str(data[name])) in keys
        and keys[(USER, str(data[name]))] is None
        for name in USER_FIELDS
    )
    return {**event, "data": data, "forgotten": forgotten}


def needed_keys(event: dict[str, Any]) -> set[Subject]:
    """The subjects whose keys (or whose forgetting) the event's fold needs."""
    data = event["data"]
    out = subjects(event["personal"], data) if event["personal"] else set()
    out.update((USER, str(data[name])) for name in USER_FIELDS if data.get(name) is not None)
    return out


def key_lookup(options: Options) -> "Callable[[set[Subject]], dict[Subject, bytes | None]]":
    """The subject keys the fold's options name (``keys_dsn``, ``keys_schema``: the event
    store's key table), read once per call; without them no key is known (every personal
    field reads redacted)."""
    dsn = options.get("keys_dsn")
    if not dsn:
        return lambda wanted: {}
    return KeyReader(dsn, options.get("keys_schema", "event_store")).lookup


def _entity(event: dict[str, Any]) -> tuple[str, str, dict[str, Any] | None, bool] | None:
    """(collection, key, fields or None for a removal, created) of an event; None: ignored."""
    data, kind = event["data"], event["event_type"]
    if kind in ("PostCreated", "PostEdited"):
        fields = {
            "post_id": int(data["post_id"]),
            "author_id": int(data["author_id"]),
            "text": str(data["text"]),
            "hashtags": list(data.get("hashtags") or []),
            "created_at": data["created_at"],
            "edited_at": data.get("edited_at"),
        }
        return POSTS, str(data["post_id"]), fields, kind == "PostCreated"
    if kind == "PostDeleted":
        return POSTS, str(data["post_id"]), None, False
    if kind == "SubjectForgotten":
        key = f"{data['subject_type']}:{data['subject_id']}"
        fields = {"subject_type": str(data["subject_type"]), "subject_id": str(data["subject_id"])}
        return FORGOTTEN, key, fields, True
    if kind in ("UserFollowed", "UserUnfollowed"):
        key = f"{int(data['follower_id'])}:{int(data['followee_id'])}"
        if kind == "UserUnfollowed":
            return FOLLOWS, key, None, False
        fields = {
            "follower_id": int(data["follower_id"]),
            "followee_id": int(data["followee_id"]),
            "followed_at": data.get("followed_at"),
        }
        return FOLLOWS, key, fields, True
    return None


def _fold_events(
    table: pa.Table,
    wanted: set[str],
    schemas: SchemaCache,
    lookup: "Callable[[set[Subject]], dict[Subject, bytes | None]]",
) -> list[pa.RecordBatch | None]:
    values = table.column("value").to_pylist()
    folded: dict[tuple[str, str], _Folded] = {}
    reasons: dict[int, str] = {}
    offsets = table.column("offset").to_pylist()
    order = sorted(range(len(values)), key=offsets.__getitem__)
    decoded: list[tuple[int, dict[str, Any]]] = []
    for row in order:
        value = values[row]
        if value is None:
            continue  # events are never deleted: a tombstone here means nothing
        try:
            decoded.append((row, decode_event(value, schemas)))
        except RegistryUnavailableError:
            raise  # the registry does not answer: the batch fails and is retried
        except Exception as exc:  # any undecodable record is a dead letter, never a stop
            reasons[row] = f"not a readable event: {type(exc).__name__}: {exc}"
    wanted_keys: set[Subject] = set()
    for _, event in decoded:
        with contextlib.suppress(Exception):  # a malformed id: a dead letter below
            wanted_keys |= needed_keys(event)
    keys = lookup(wanted_keys)
    for row, event in decoded:
        try:
            event = open_event(event, keys)
            entity = _entity(event)
        except Exception as exc:  # any unreadable event is a dead letter, never a stop
            reasons[row] = f"not a readable event: {type(exc).__name__}: {exc}"
            continue
        if entity is None or entity[0] not in wanted:
            continue
        collection, key, fields, created = entity
        if event["forgotten"] and collection != FORGOTTEN:
            fields, created = None, False  # it names a forgotten user: a removal
        version = int(event["version"])
        current = folded.get((collection, key))
        if current is not None and version <= current.position:
            continue  # a re-sent older event
        if current is None or created or current.fields is None:
            current = _Folded(collection, key, version, fields, [], created)
            folded[(collection, key)] = current
        current.position, current.fields, current.row = version, fields, row
        if fields is not None:
            current.changes.append(version)
    return [_write_batch(table, list(folded.values())), rejections(table, reasons)]


def _write_batch(table: pa.Table, items: list[_Folded]) -> pa.RecordBatch | None:
    if not items:
        return None
    rows = pa.array([item.row for item in items], pa.int64())
    return folded_batch(
        {
            "collection": [item.collection for item in items],
            "key": [item.key for item in items],
            "position": [item.position for item in items],
            "deleted": [item.fields is None for item in items],
            "fields": [None if item.fields is None else json.dumps(item.fields) for item in items],
            "changes": [item.changes for item in items],
            "fresh": [item.fresh for item in items],
            "topic": table.column("topic").take(rows),
            "partition": table.column("partition").take(rows),
            "offset": table.column("offset").take(rows),
        },
        len(items),
    )
