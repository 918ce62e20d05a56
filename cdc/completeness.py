"""Completeness of what CDC published, checked against the source of truth, and its repair.

Brokers lose data in crashes (the local broker drops the last acknowledged records on
``kill -9``), a replication slot can be invalidated and replaced by a snapshot that carries no
deletes, a topic can be recreated. So the source of truth is compared with the topics:

- a captured **table** with its topic: the topic's latest change per key (by LSN) against the
  table's rows - rows *missing* from the topic, rows whose latest change on the topic is *stale*
  (values differ, compared in SQL after converting Debezium's JSON encodings exactly as the
  mirror does), and keys the topic still holds that the table no longer has (*extra*: a delete
  that never reached the topic);
- the **event store** with the ``events.<type>`` topics: events *missing* from their topic,
  events on a topic more than once (*duplicated*: harmless re-deliveries, consumers drop them
  by version), and events on a topic the store does not have (*unknown*).

Repair: missing and stale rows are re-read by an incremental snapshot of exactly those keys
(Debezium's ``execute-snapshot`` signal with a filter); extra keys get a delete and a
tombstone at the current WAL position; missing events are re-published from the event store
in the outbox's encoding. The views then converge by themselves: positions make everything
idempotent.

Each comparison reads only what its topics gained since the last one (:mod:`cdc.checked`): the
latest change per key and the event ids seen are kept with the offsets they were read to. A
run with ``full`` (or without a checkpoint folder) reads every topic from its start.
"""

import base64
import json
import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import Producer
from psycopg import sql

from cdc.checked import CheckedTopics, Checkpoint
from cdc.outbox import EventOutbox
from cdc.published import PublishedStreams
from cdc.publisher import (
    LSN_HEADER,
    TXID_HEADER,
    PublishedEvent,
    StreamVersion,
    latest_per_stream,
)
from connectors.debezium import SIGNAL_SCHEMA, SIGNAL_TABLE, debezium_encoding
from connectors.errors import TopicRewoundError
from connectors.kafka import KafkaConfig, TopicAdmin
from connectors.kafka.config import ClientValue
from connectors.kafka.reading import Record, read_tail
from connectors.postgres import PostgresConfig, table_columns
from connectors.schema_registry.client import RegistryClient
from connectors.stores.pg_tables import TypedColumn
from event_store.outbox import OUTBOX_TABLE, event_topic
from tributary.changes import ChangeDecodeError, ChangeEvent, Row

SIGNAL_LIMIT = 2000  # characters of a signal's data (the signal table's column is 2048)
SAMPLE = 20  # keys listed per problem in a report
_PRODUCER: dict[str, ClientValue] = {"enable.idempotence": True, "partitioner": "murmur2_random"}

log = logging.getLogger(__name__)


@dataclass
class TableReport:
    """A captured table against its topic."""

    table: str
    topic: str
    rows: int = 0
    missing: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    undecodable: int = 0
    read: int = 0  # records read this run
    whole: bool = True  # read from the start (no usable checkpoint)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.stale or self.extra)

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "topic": self.topic,
            "rows": self.rows,
            "missing": len(self.missing),
            "stale": len(self.stale),
            "extra": len(self.extra),
            "undecodable_records": self.undecodable,
            "records_read": self.read,
            "read_whole": self.whole,
            "sample": {
                "missing": self.missing[:SAMPLE],
                "stale": self.stale[:SAMPLE],
                "extra": self.extra[:SAMPLE],
            },
            "ok": self.ok,
        }


@dataclass
class EventsReport:
    """The event store against the ``events.<type>`` topics."""

    events: int = 0
    missing: list[tuple[str, str, int]] = field(default_factory=list)  # (type, stream, version)
    duplicated: int = 0
    unknown: list[str] = field(default_factory=list)  # event ids
    read: int = 0  # records read this run
    whole: bool = True  # every topic read from its start (no usable checkpoint)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unknown)

    def as_dict(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "missing": len(self.missing),
            "duplicated": self.duplicated,
            "unknown": len(self.unknown),
            "records_read": self.read,
            "read_whole": self.whole,
            "sample": {
                "missing": [f"{t}/{s}@{v}" for t, s, v in self.missing[:SAMPLE]],
                "unknown": self.unknown[:SAMPLE],
            },
            "ok": self.ok,
        }


# -- tables ---------------------------------------------------------------------------------


@dataclass
class _TopicRead:
    """What a topic gained since its checkpoint, and the summary it adds to."""

    records: list[Record]
    summary: dict[str, Any]
    ends: dict[int, int]
    whole: bool


def _read_since(
    kafka: KafkaConfig, checked: CheckedTopics, kind: str, topic: str, full: bool
) -> _TopicRead:
    """The records after the topic's checkpoint (all of them with ``full``, without a
    checkpoint, or when the topic was rewound)."""
    previous = None if full else checked.load(kind, topic)
    if previous is not None:
        try:
            tail = read_tail(kafka, topic, previous.ends)
            return _TopicRead(tail.records, previous.summary, tail.ends, whole=False)
        except TopicRewoundError as exc:
            log.warning("%s: reading it whole again", exc)
    tail = read_tail(kafka, topic, {})
    return _TopicRead(tail.records, {}, tail.ends, whole=True)


def _latest(
    kafka: KafkaConfig, topic: str, checked: CheckedTopics, full: bool, report: "TableReport"
) -> dict[str, tuple[int, Row | None]]:
    """The topic's latest change per key (position, row after it or None once deleted),
    from the checkpoint and what came after; counts in ``report`` what was read and what did
    not decode."""
    if topic not in TopicAdmin(kafka).topic_names():
        checked.drop("table", topic)
        return {}
    read = _read_since(kafka, checked, "table", topic, full)
    latest: dict[str, tuple[int, Row | None]] = {
        k: (int(v[0]), v[1]) for k, v in read.summary.get("latest", {}).items()
    }
    bad = int(read.summary.get("undecodable", 0))
    for record in read.records:
        try:
            change = ChangeEvent.from_kafka(topic, record.key, record.value, record.headers)
        except ChangeDecodeError:
            bad += 1
            continue
        if change.source is None:
            continue  # a tombstone without position only confirms a delete
        key = json.dumps(change.key, sort_keys=True, separators=(",", ":"))
        known = latest.get(key)
        if known is None or change.position >= known[0]:
            latest[key] = (change.position, None if change.is_delete else change.after)
    checked.save(
        "table",
        topic,
        Checkpoint(
            read.ends, {"latest": {k: list(v) for k, v in latest.items()}, "undecodable": bad}
        ),
    )
    report.undecodable, report.read, report.whole = bad, len(read.records), read.whole
    return latest


def _texts(conn: psycopg.Connection[Any], query: sql.Composed) -> list[str]:
    """The first column of a query's rows, as text."""
    return [str(r[0]) for r in conn.execute(query).fetchall()]


def compare_table(
    db: PostgresConfig,
    kafka: KafkaConfig,
    table: str,
    topic: str,
    checked: CheckedTopics | None = None,
    full: bool = False,
) -> TableReport:
    """The table's rows against the topic's latest change per key (read since ``checked``'s
    checkpoint, or whole)."""
    schema, name = table.split(".", 1)
    columns = table_columns(db.dsn, schema, name)
    keys = [c.name for c in columns if c.primary_key]
    report = TableReport(table, topic)
    if not columns or not keys:
        return report
    latest = _latest(kafka, topic, checked or CheckedTopics(None), full, report)
    typed = [TypedColumn(c.name, c.sql_type, debezium_encoding(c)) for c in columns]
    by_name = {c.name: c for c in typed}
    ident = sql.Identifier(schema, name)
    with psycopg.connect(db.dsn) as conn:
        conn.execute("CREATE TEMP TABLE topic_state (k jsonb, r jsonb) ON COMMIT DROP")
        with conn.cursor() as cur, cur.copy("COPY topic_state (k, r) FROM STDIN") as copy:
            for key, (_, live) in latest.items():
                copy.write_row((key, None if live is None else json.dumps(live)))
        key_of_state = sql.SQL(" AND ").join(
            sql.SQL("t.{} = {}").format(sql.Identifier(k), by_name[k].value_sql(sql.SQL("s.k")))
            for k in keys
        )
        key_json = sql.SQL("jsonb_build_object({})::text").format(
            sql.SQL(", ").join(
                sql.SQL("{}, t.{}").format(sql.Literal(k), sql.Identifier(k)) for k in keys
            )
        )
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(ident)).fetchone()
        report.rows = int(row[0]) if row else 0
        report.missing = _texts(
            conn,
            sql.SQL(
                "SELECT {key} FROM {t} t WHERE NOT EXISTS"
                " (SELECT 1 FROM topic_state s WHERE s.r IS NOT NULL AND {match})"
            ).format(key=key_json, t=ident, match=key_of_state),
        )
        values = [c for c in typed if c.name not in keys]
        differs = sql.SQL(" OR ").join(
            sql.SQL("t.{} IS DISTINCT FROM {}").format(
                sql.Identifier(c.name), c.value_sql(sql.SQL("s.r"))
            )
            for c in values
        )
        if values:
            report.stale = _texts(
                conn,
                sql.SQL(
                    "SELECT {key} FROM {t} t JOIN topic_state s ON s.r IS NOT NULL AND {match}"
                    " WHERE {differs}"
                ).format(key=key_json, t=ident, match=key_of_state, differs=differs),
            )
        report.extra = _texts(
            conn,
            sql.SQL(
                "SELECT s.k::text FROM topic_state s WHERE s.r IS NOT NULL AND NOT EXISTS"
                " (SELECT 1 FROM {t} t WHERE {match})"
            ).format(t=ident, match=key_of_state),
        )
    return report


def repair_table(db: PostgresConfig, kafka: KafkaConfig, report: TableReport) -> dict[str, int]:
    """Re-read missing and stale rows by an incremental snapshot of those keys; delete extra
    keys on the topic at the current WAL position. Needs the connector running to act on the
    snapshot signal. Returns what was asked for."""
    resnapshot = [*report.missing, *report.stale]
    signals = request_key_snapshot(db, report.table, resnapshot) if resnapshot else 0
    deleted = publish_deletes(db, kafka, report.topic, report.extra) if report.extra else 0
    return {"snapshot_keys": len(resnapshot), "signals": signals, "deletes_published": deleted}


def request_key_snapshot(db: PostgresConfig, table: str, keys: Sequence[str]) -> int:
    """Incremental-snapshot signals for these keys (JSON objects of the key columns), as few
    as fit the signal table; returns how many were inserted."""
    conditions = [_condition(json.loads(k)) for k in keys]
    batches: list[list[str]] = [[]]
    for condition in conditions:
        candidate = [*batches[-1], condition]
        if len(_signal(table, candidate)) > SIGNAL_LIMIT and batches[-1]:
            batches.append([condition])
        else:
            batches[-1] = candidate
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        for batch in batches:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.{} (id, type, data) VALUES (%s, 'execute-snapshot', %s)"
                ).format(sql.Identifier(SIGNAL_SCHEMA), sql.Identifier(SIGNAL_TABLE)),
                (str(uuid.uuid4()), _signal(table, batch)),
            )
    return len(batches)


def _condition(key: dict[str, Any]) -> str:
    parts = []
    for column, value in key.items():
        literal = (
            str(value)
            if isinstance(value, int | float)
            else "'" + str(value).replace("'", "''") + "'"
        )
        parts.append(f'"{column}" = {literal}')
    return "(" + " AND ".join(parts) + ")"


def _signal(table: str, conditions: list[str]) -> str:
    return json.dumps(
        {
            "data-collections": [table],
            "type": "incremental",
            "additional-conditions": [
                {"data-collection": table, "filter": " OR ".join(conditions)}
            ],
        }
    )


def publish_deletes(db: PostgresConfig, kafka: KafkaConfig, topic: str, keys: Iterable[str]) -> int:
    """A delete change and its tombstone for each key, positioned at the current WAL LSN (past
    every change the key had), so every consumer removes it."""
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").fetchone()
    assert row is not None
    lsn = int(row[0])
    producer = Producer(kafka.client_properties(**_PRODUCER))
    schema, table = topic.split(".")[-2:]
    count = 0
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for key in keys:
        envelope = {
            "before": json.loads(key),
            "after": None,
            "op": "d",
            "source": {"lsn": lsn, "txId": None, "schema": schema, "table": table, "repair": True},
            "ts_ms": 0,
        }
        headers: list[tuple[str, str | bytes | None]] = [
            (LSN_HEADER, str(lsn).encode()),
            (TXID_HEADER, b"0"),
        ]
        producer.produce(
            topic,
            key=key.encode(),
            value=json.dumps(envelope).encode(),
            headers=headers,
            on_delivery=delivered,
        )
        producer.produce(
            topic, key=key.encode(), value=None, headers=headers, on_delivery=delivered
        )
        count += 1
    if producer.flush(30) != 0 or errors:
        raise RuntimeError(f"repair deletes not acknowledged on {topic}: {errors[:3]}")
    return count


# -- events ---------------------------------------------------------------------------------


def compare_events(
    db: PostgresConfig,
    kafka: KafkaConfig,
    schema: str,
    prefix: str = "events.",
    checked: CheckedTopics | None = None,
    full: bool = False,
) -> EventsReport:
    """Every event of the store against its ``events.<type>`` topic, by event id (the topics
    read since ``checked``'s checkpoints, or whole)."""
    checked = checked or CheckedTopics(None)
    report = EventsReport()
    with psycopg.connect(db.dsn) as conn:
        rows = conn.execute(
            sql.SQL("SELECT event_id::text, stream_type, stream_id, version FROM {}").format(
                sql.Identifier(schema, OUTBOX_TABLE)
            )
        ).fetchall()
    stored = {str(r[0]): (str(r[1]), str(r[2]), int(r[3])) for r in rows}
    report.events = len(stored)
    seen: dict[str, int] = {}
    topics = {event_topic(kind, prefix) for kind, _, _ in stored.values()}
    existing = set(TopicAdmin(kafka).topic_names())
    topics |= {t for t in existing if t.startswith(prefix)}
    for topic in sorted(topics - existing):
        checked.drop("events", topic)
    for topic in sorted(topics & existing):
        read = _read_since(kafka, checked, "events", topic, full)
        counts: dict[str, int] = {k: int(v) for k, v in read.summary.get("seen", {}).items()}
        for record in read.records:
            event_id = (record.headers.get("event_id") or b"").decode()
            if event_id:
                counts[event_id] = counts.get(event_id, 0) + 1
        checked.save("events", topic, Checkpoint(read.ends, {"seen": counts}))
        report.read += len(read.records)
        report.whole = report.whole and read.whole
        for event_id, n in counts.items():
            seen[event_id] = seen.get(event_id, 0) + n
    report.missing = sorted(v for k, v in stored.items() if k not in seen)
    report.duplicated = sum(n - 1 for n in seen.values() if n > 1)
    report.unknown = sorted(k for k in seen if k not in stored)
    return report


def republish_events(
    db: PostgresConfig,
    kafka: KafkaConfig,
    schema: str,
    missing: Sequence[tuple[str, str, int]],
    prefix: str = "events.",
    registry_url: str | None = None,
) -> int:
    """Publish the missing events again from the event store, in the outbox's encoding, and
    record where they landed (read-your-writes)."""
    if not missing:
        return 0
    wanted = {(stream, version) for _, stream, version in missing}
    with psycopg.connect(db.dsn) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT event_id, event_type, schema_version, stream_type, stream_id, version,"
                " position, recorded_at, data, metadata, schema_id, payload FROM {}"
                " WHERE stream_id = ANY(%s)"
                " ORDER BY stream_id, version"
            ).format(sql.Identifier(schema, OUTBOX_TABLE)),
            (sorted({s for s, _ in wanted}),),
        ).fetchall()
    if registry_url is None:
        raise ValueError("re-publishing events needs the schema registry's URL")
    outbox = EventOutbox(RegistryClient(registry_url), prefix)
    producer = Producer(kafka.client_properties(**_PRODUCER))
    delivered: list[PublishedEvent] = []
    errors: list[str] = []

    def landed(stream: StreamVersion | None) -> Any:
        def report(err: Any, message: Any) -> None:
            if err is not None:
                errors.append(str(err))
            elif stream is not None:
                delivered.append(
                    PublishedEvent(stream, message.topic(), message.partition(), message.offset())
                )

        return report

    count = 0
    for row in rows:
        if (row[4], int(row[5])) not in wanted:
            continue
        after = {
            "event_id": str(row[0]),
            "event_type": row[1],
            "schema_version": row[2],
            "stream_type": row[3],
            "stream_id": row[4],
            "version": row[5],
            "position": row[6],
            "recorded_at": row[7].isoformat(),
            "data": json.dumps(row[8]),
            "metadata": json.dumps(row[9] or {}),
            "schema_id": row[10],
            "payload": None if row[11] is None else base64.b64encode(row[11]).decode(),
        }
        envelope = json.dumps({"op": "c", "after": after, "source": {"lsn": 0}})
        for out in outbox.route(envelope, b"0"):
            producer.produce(
                out.topic,
                key=out.key,
                value=out.value,
                headers=out.headers,
                on_delivery=landed(out.stream),
            )
        count += 1
    if producer.flush(30) != 0 or errors:
        raise RuntimeError(f"re-published events not acknowledged: {errors[:3]}")
    published = PublishedStreams(db, schema)
    try:
        published.record(latest_per_stream(delivered))
    finally:
        published.close()
    return count
