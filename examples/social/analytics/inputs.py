"""What the analytics jobs read, decoded into one row shape (:data:`INPUT_DDL`).

Three kinds of topic, named per job (``kinds``: topic -> ``activity`` | ``events`` | ``users``):

- ``activity`` (JSON, the front end's events, three timestamps): ``search`` and ``click`` rows;
- ``events.post`` / ``events.follows`` (the outbox's Avro, Confluent wire format; schemas by
  id from the registry at ``registry_url``): ``post`` (a post created: author,
  hashtags), ``like`` (``user_id`` liked ``post_id`` of author ``other_id``), ``follow`` and
  ``unfollow`` (``user_id`` follows ``other_id``); event time = the domain time
  (``created_at``, ``liked_at``, ...), sent = received = when the event store recorded it;
- ``cdc.public.users`` (Debezium JSON): ``user`` (``profile`` = the row as JSON) and
  ``user_deleted``; event time = the commit time (``source.ts_ms``), version = the LSN;
- ``events.subject`` (kind ``events``, the audit events of ``tributary forget``): ``forgotten``
  (``user_id`` = a forgotten user's id) for each ``SubjectForgotten`` of a user; no times
  (it moves no watermark and is never late), so each job's processor passes it through.

A record that cannot be decoded becomes a row with ``error`` set (a dead letter of the job).
Decoding runs on the executors (``mapInArrow``); the time columns of
:func:`projections.time.with_event_time` are added in Spark.
"""

import json
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from connectors.avro import SchemaCache, registry_schemas
from connectors.schema_registry.errors import RegistryUnavailableError
from examples.social.views.folds import decode_event
from projections.folding import parse_json, records_table, spark_ddl
from projections.time import Lateness, with_event_time
from projections.view import PartitionFold, per_partition

INPUT_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("event_id", pa.string()),
        ("session_id", pa.string()),
        ("user_id", pa.int64()),
        ("other_id", pa.int64()),
        ("post_id", pa.int64()),
        ("query", pa.string()),
        ("search_id", pa.string()),
        ("search_time", pa.int64()),
        ("tags", pa.list_(pa.string())),
        ("profile", pa.string()),
        ("event_time", pa.int64()),
        ("sent_time", pa.int64()),
        ("received_time", pa.int64()),
        ("version", pa.int64()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("error", pa.string()),
        ("raw_key", pa.binary()),
        ("raw_value", pa.binary()),
    ]
)

INPUT_DDL = spark_ddl(INPUT_SCHEMA)

ACTIVITY_JSON = pa.schema(
    [
        ("event_id", pa.string()),
        ("type", pa.string()),
        ("session_id", pa.string()),
        ("user_id", pa.int64()),
        ("event_time", pa.int64()),
        ("sent_time", pa.int64()),
        ("received_time", pa.int64()),
        ("query", pa.string()),
        ("search_id", pa.string()),
        ("search_time", pa.int64()),
        ("post_id", pa.int64()),
    ]
)

_REQUIRED = (
    "event_id",
    "type",
    "session_id",
    "user_id",
    "event_time",
    "sent_time",
    "received_time",
)


def decode(
    batches: Iterable[pa.RecordBatch], kinds: Mapping[str, str], registry_url: str
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: Kafka records (one task's) -> input rows."""
    table = records_table(batches)
    if table.num_rows == 0:
        return
    for topic in table.column("topic").unique().to_pylist():
        part = table.filter(pc.equal(table.column("topic"), topic))
        kind = kinds.get(topic)
        if kind == "activity":
            out = decode_activity(part)
        elif kind == "events":
            out = _rows(part, _event_rows(part, registry_schemas(registry_url)))
        elif kind == "users":
            out = _rows(part, _user_rows(part))
        else:
            continue
        if out.num_rows:
            yield out


def decode_partition(
    batches: Iterable[pa.RecordBatch], options: Mapping[str, str]
) -> Iterator[pa.RecordBatch]:
    """:func:`decode` as a per-partition stage of the Kafka source (options: ``kinds`` as
    JSON, ``registry_url``)."""
    return decode(batches, json.loads(options["kinds"]), options["registry_url"])


def decoder(kinds: Mapping[str, str], registry_url: str) -> PartitionFold:
    """The decoding stage of a job reading these topics: it runs inside the Kafka source's read
    task (``View.decode``), so the job's records reach Spark already decoded."""
    return per_partition(
        "examples.social.analytics.inputs:decode_partition",
        schema=INPUT_DDL,
        kinds=json.dumps(dict(kinds), sort_keys=True),
        registry_url=registry_url,
    )


def inputs(decoded: Any, lateness: Lateness) -> Any:
    """Decoded input rows (the job's ``decoder`` ran in the source) with corrected event time,
    lateness and Spark's watermark (:func:`projections.time.with_event_time`)."""
    return with_event_time(decoded, lateness)


# -- activity (columnar) -----------------------------------------------------------------


def decode_activity(part: pa.Table) -> pa.RecordBatch:
    values = part.column("value").combine_chunks()
    parsed, bad = parse_json(values, ACTIVITY_JSON)
    n = part.num_rows
    reasons: dict[int, str] = {i: f"activity record {r}" for i, r in bad.items()}
    if parsed is None:
        parsed = pa.table({f.name: pa.nulls(n, f.type) for f in ACTIVITY_JSON})
    for index in np.flatnonzero(~pc.is_valid(values).to_numpy(zero_copy_only=False)):
        reasons.setdefault(int(index), "activity record has no value")
    kind = parsed.column("type").combine_chunks()
    known = pc.fill_null(pc.is_in(kind, pa.array(["search", "click"])), False)
    received = parsed.column("received_time").combine_chunks()
    checks: list[tuple[str, pa.Array]] = [
        (name, pc.is_valid(parsed.column(name).combine_chunks())) for name in _REQUIRED
    ]
    is_click = pc.fill_null(pc.equal(kind, "click"), False)
    for name in ("search_id", "search_time", "post_id"):
        present = pc.is_valid(parsed.column(name).combine_chunks())
        checks.append((name, pc.or_(pc.invert(is_click), present)))
    known_np = known.to_numpy(zero_copy_only=False)
    for index in np.flatnonzero(~known_np):
        reasons.setdefault(int(index), f"activity record of unknown type {kind[index].as_py()!r}")
    for name, ok in checks:
        for index in np.flatnonzero(~ok.to_numpy(zero_copy_only=False)):
            reasons.setdefault(int(index), f"activity record without {name}")
    error = np.full(n, None, dtype=object)
    for row, reason in reasons.items():
        error[row] = reason
    failed = pa.array([r is not None for r in error])
    columns: dict[str, Any] = {
        "kind": pc.if_else(failed, pa.scalar(None, pa.string()), kind),
        "event_id": parsed.column("event_id"),
        "session_id": parsed.column("session_id"),
        "user_id": parsed.column("user_id"),
        "post_id": parsed.column("post_id"),
        "query": parsed.column("query"),
        "search_id": parsed.column("search_id"),
        "search_time": parsed.column("search_time"),
        "event_time": parsed.column("event_time"),
        "sent_time": parsed.column("sent_time"),
        "received_time": received,
        "error": pa.array(error, pa.string()),
        "raw_key": pc.if_else(failed, part.column("key"), pa.scalar(None, pa.binary())),
        "raw_value": pc.if_else(failed, values, pa.scalar(None, pa.binary())),
    }
    return _batch(part, columns, n)


# -- events and users (one record at a time) -------------------------------------------


def _ms(value: Any) -> int:
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, (int, float)):
        return int(value)
    return int(datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp() * 1000)


def _event_rows(part: pa.Table, schemas: SchemaCache) -> list[dict[str, Any] | None]:
    rows: list[dict[str, Any] | None] = []
    for value in part.column("value").to_pylist():
        if value is None:
            rows.append(None)
            continue
        try:
            rows.append(_event_row(decode_event(value, schemas)))
        except RegistryUnavailableError:
            raise  # the registry does not answer: the batch fails and is retried
        except Exception as exc:  # any undecodable record is a dead letter, never a stop
            rows.append({"error": f"not a readable event: {type(exc).__name__}: {exc}"})
    return rows


def _event_row(event: dict[str, Any]) -> dict[str, Any] | None:
    data, kind = event["data"], event["event_type"]
    recorded = _ms(event["occurred_at"])
    base = {
        "event_id": str(event["event_id"]),
        "version": int(event["version"]),
        "sent_time": recorded,
        "received_time": recorded,
    }
    if kind == "PostCreated":
        return {
            **base,
            "kind": "post",
            "user_id": int(data["author_id"]),
            "post_id": int(data["post_id"]),
            "tags": [str(t) for t in data.get("hashtags") or []],
            "event_time": _ms(data["created_at"]),
        }
    if kind == "PostLiked":
        return {
            **base,
            "kind": "like",
            "user_id": int(data["user_id"]),
            "other_id": int(data["author_id"]),
            "post_id": int(data["post_id"]),
            "event_time": _ms(data["liked_at"]),
        }
    if kind == "SubjectForgotten":
        subject = str(data["subject_id"])
        if data["subject_type"] != "user" or not subject.isdecimal():
            return None  # not one of the social network's users
        return {
            "event_id": base["event_id"],
            "version": base["version"],
            "kind": "forgotten",
            "user_id": int(subject),
        }
    if kind in ("UserFollowed", "UserUnfollowed"):
        followed = kind == "UserFollowed"
        return {
            **base,
            "kind": "follow" if followed else "unfollow",
            "user_id": int(data["follower_id"]),
            "other_id": int(data["followee_id"]),
            "event_time": _ms(data["followed_at" if followed else "unfollowed_at"]),
        }
    return None


def _user_rows(part: pa.Table) -> list[dict[str, Any] | None]:
    rows: list[dict[str, Any] | None] = []
    keys = part.column("key").to_pylist()
    for key, value in zip(keys, part.column("value").to_pylist(), strict=True):
        if value is None:
            rows.append(None)  # the tombstone after a delete: the delete itself came first
            continue
        try:
            rows.append(_user_row(json.loads(value), key))
        except Exception as exc:
            rows.append({"error": f"not a readable change: {type(exc).__name__}: {exc}"})
    return rows


def _user_row(change: dict[str, Any], key: bytes | None) -> dict[str, Any] | None:
    source = change.get("source") or {}
    committed = int(source.get("ts_ms") or 0)
    seen = int(change.get("ts_ms") or committed)
    base = {
        "event_time": committed,
        "sent_time": seen,
        "received_time": seen,
        "version": int(source.get("lsn") or 0),
        "event_id": f"{source.get('lsn') or 0}",
    }
    if change.get("op") == "d":
        before = change.get("before") or (json.loads(key) if key else {})
        return {**base, "kind": "user_deleted", "user_id": int(before["id"])}
    after = change.get("after")
    if not isinstance(after, dict):
        return None
    profile = {k: after.get(k) for k in ("handle", "display_name", "bio")}
    return {**base, "kind": "user", "user_id": int(after["id"]), "profile": json.dumps(profile)}


def _rows(part: pa.Table, rows: list[dict[str, Any] | None]) -> pa.RecordBatch:
    """Input rows from decoded dicts (None: nothing to emit for that record)."""
    keep = [i for i, row in enumerate(rows) if row is not None]
    picked = part.take(pa.array(keep, pa.int64()))
    kept = [rows[i] or {} for i in keep]
    columns: dict[str, Any] = {}
    for field in INPUT_SCHEMA:
        if field.name in ("topic", "partition", "offset"):
            continue
        if field.name in ("raw_key", "raw_value"):
            source = picked.column("key" if field.name == "raw_key" else "value").to_pylist()
            columns[field.name] = [
                s if "error" in r else None for s, r in zip(source, kept, strict=True)
            ]
            continue
        columns[field.name] = [r.get(field.name) for r in kept]
    return _batch(picked, columns, len(kept))


def _batch(part: pa.Table, columns: dict[str, Any], n: int) -> pa.RecordBatch:
    arrays = []
    for field in INPUT_SCHEMA:
        if field.name in ("topic", "partition", "offset"):
            value: Any = part.column(field.name)
        else:
            value = columns.get(field.name)
        if value is None:
            arrays.append(pa.nulls(n, field.type))
        elif isinstance(value, pa.ChunkedArray):
            arrays.append(value.combine_chunks().cast(field.type))
        elif isinstance(value, pa.Array):
            arrays.append(value.cast(field.type))
        else:
            arrays.append(pa.array(value, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=INPUT_SCHEMA)


def sample(events: Iterable[bytes], topic: str = "activity") -> pa.Table:
    """Kafka-record rows for values (unit tests of the decoder)."""
    values = list(events)
    n = len(values)
    return pa.table(
        {
            "key": pa.array([b"k"] * n, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "topic": pa.array([topic] * n, pa.string()),
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(list(range(n)), pa.int64()),
        }
    )
