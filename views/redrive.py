"""Dead letters handled, not just kept: list a view's dead letters, show one, and re-feed them
to the view after a fix (``tributary dlq list|show|redrive``).

A redrive appends each chosen dead letter back to the partition of the topic it came from
(what SQS's DLQ redrive does with a queue): the original record when it is still there (its
key, value and headers), else the dead letter's key and value; either way with the header
``tributary.redriven.from`` = ``dlq.<view>:<partition>:<offset>``. The fixed view reads it like
any record; other views of that topic see a copy of a record they had, which their per-key
position guards ignore (the same at-least-once re-delivery CDC makes after a crash; `verify`
counts it as a harmless duplicate).

Exactly once. A ledger in the views' schema (``_tributary_redriven``) names each dead letter
redriven, written in the transaction that holds the view's redrive lock while the records are
produced and acknowledged: a dead letter in the ledger is never produced again, so a second
redrive changes nothing. A crash after the produce and before the ledger's commit leaves the
record unrecorded; the next redrive produces it once more and the view's position guard drops
the copy (its position is at or below the one it applied), so the view still applies it once.

A state topic (``cleanup.policy=compact``) keeps only the latest record per key: appending an
old change after a newer one of its key would make compaction keep the old one. A dead letter
whose key has a later record on its partition is therefore not appended but recorded as
*superseded* (the view applied the newer change, which its guard would prefer anyway).
"""

import base64
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg import sql

from connectors.kafka import KafkaConfig, TopicAdmin
from connectors.kafka.producing import idempotent_producer
from connectors.kafka.reading import Record, read_at, read_range, read_topic
from views.dead_letters import REASON_HEADER, dlq_topic
from views.errors import DeadLetterError

__all__ = [
    "REDRIVEN_HEADER",
    "DeadLetterRecord",
    "RedriveLedger",
    "RedriveOutcome",
    "dead_letters",
    "redrive",
    "select_letters",
]

REDRIVEN_HEADER = "tributary.redriven.from"
LEDGER_TABLE = "_tributary_redriven"


@dataclass(frozen=True)
class DeadLetterRecord:
    """One record on ``dlq.<view>``: where it is, why it was refused, where it came from."""

    view: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: str
    stage: str
    source_topic: str
    source_partition: int
    source_offset: int
    at: float | None  # when it was dead-lettered (Unix seconds)

    @property
    def id(self) -> str:
        """``<partition>:<offset>`` on the dead-letter topic."""
        return f"{self.partition}:{self.offset}"

    def as_dict(self, *, full: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "at": self.at,
            "stage": self.stage,
            "reason": self.reason,
            "source": f"{self.source_topic}:{self.source_partition}:{self.source_offset}",
            "key": printable(self.key),
        }
        if full:
            out["value"] = printable(self.value)
        return out


def printable(raw: bytes | None) -> str | None:
    """UTF-8 text as is, anything else as ``base64:…`` (Avro in the Confluent wire format)."""
    if raw is None:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(raw).decode()


def _text(headers: dict[str, bytes | None], name: str, default: str = "") -> str:
    value = headers.get(name)
    return default if value is None else value.decode(errors="replace")


def _letter(view: str, record: Record) -> DeadLetterRecord:
    h = record.headers
    return DeadLetterRecord(
        view,
        record.partition,
        record.offset,
        record.key,
        record.value,
        _text(h, REASON_HEADER, "(no reason)"),
        _text(h, "tributary.error.stage", "?"),
        _text(h, "tributary.source.topic"),
        int(_text(h, "tributary.source.partition", "-1") or -1),
        int(_text(h, "tributary.source.offset", "-1") or -1),
        None if record.timestamp_ms is None else record.timestamp_ms / 1000.0,
    )


def dead_letters(kafka: KafkaConfig, view: str) -> list[DeadLetterRecord]:
    """Every dead letter of ``view`` (none when it never had one)."""
    topic = dlq_topic(view)
    if topic not in TopicAdmin(kafka).topic_names():
        return []
    return [_letter(view, r) for r in read_topic(kafka, topic)]


def parse_id(text: str) -> str:
    """``P:O`` as is; a bare offset means partition 0 (dead-letter topics have one)."""
    text = text.strip()
    partition, colon, offset = text.rpartition(":")
    try:
        return f"{int(partition) if colon else 0}:{int(offset)}"
    except ValueError:
        raise DeadLetterError(
            f"{text!r} is not a dead letter's id (PARTITION:OFFSET or OFFSET, as `tributary dlq"
            " list` prints it)"
        ) from None


def select_letters(
    letters: Sequence[DeadLetterRecord],
    *,
    since: float | None = None,
    ids: Iterable[str] | None = None,
) -> list[DeadLetterRecord]:
    """The dead letters dead-lettered at or after ``since`` (Unix seconds) and, with ``ids``,
    only those; an id that names no dead letter raises."""
    chosen = [d for d in letters if since is None or (d.at is not None and d.at >= since)]
    if ids is None:
        return chosen
    wanted = {parse_id(i) for i in ids}
    unknown = sorted(wanted - {d.id for d in letters})
    if unknown:
        raise DeadLetterError(
            f"no dead letter {', '.join(unknown)} among the view's"
            " (`tributary dlq list VIEW` shows them)"
        )
    return [d for d in chosen if d.id in wanted]


Outcome = Literal["redriven", "superseded", "already redriven", "no source"]


@dataclass(frozen=True)
class RedriveOutcome:
    """What became of one dead letter: appended (``target_offset``), superseded by a later
    record of its key on a state topic, redriven before, or of no known source."""

    id: str
    outcome: Outcome
    target: str | None = None  # topic:partition:offset it was appended at
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "outcome": self.outcome,
            "target": self.target,
            "detail": self.detail,
        }


class RedriveLedger:
    """``<schema>._tributary_redriven``: the dead letters of each view already redriven."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self.table = sql.Identifier(schema, LEDGER_TABLE)

    def ensure(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
        conn.execute(
            sql.SQL(
                """CREATE TABLE IF NOT EXISTS {} (
                   view text NOT NULL, dlq_partition int NOT NULL, dlq_offset bigint NOT NULL,
                   outcome text NOT NULL, target text, detail text NOT NULL DEFAULT '',
                   redriven_at timestamptz NOT NULL DEFAULT now(),
                   PRIMARY KEY (view, dlq_partition, dlq_offset))"""
            ).format(self.table)
        )

    def done(self, conn: psycopg.Connection[Any], view: str) -> dict[str, str]:
        """Id -> outcome of every dead letter of ``view`` in the ledger."""
        rows = conn.execute(
            sql.SQL("SELECT dlq_partition, dlq_offset, outcome FROM {} WHERE view = %s").format(
                self.table
            ),
            (view,),
        ).fetchall()
        return {f"{p}:{o}": outcome for p, o, outcome in rows}

    def counts(self) -> dict[str, int]:
        """Per view, the dead letters redriven (appended back); {} when there is no ledger."""
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
                rows = conn.execute(
                    sql.SQL(
                        "SELECT view, count(*) FROM {} WHERE outcome = 'redriven' GROUP BY view"
                    ).format(self.table)
                ).fetchall()
        except psycopg.errors.UndefinedTable:
            return {}
        return {view: int(n) for view, n in rows}

    def record(self, conn: psycopg.Connection[Any], view: str, done: list[RedriveOutcome]) -> None:
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL(
                    "INSERT INTO {} (view, dlq_partition, dlq_offset, outcome, target, detail)"
                    " VALUES (%s, %s, %s, %s, %s, %s)"
                ).format(self.table),
                [(view, *map(int, d.id.split(":")), d.outcome, d.target, d.detail) for d in done],
            )


def redrive(
    kafka: KafkaConfig,
    ledger: RedriveLedger,
    view: str,
    letters: Sequence[DeadLetterRecord],
    timeout: float = 30.0,
) -> list[RedriveOutcome]:
    """Append ``letters`` back to their source partitions, each at most once (see the module's
    docstring); the outcome of each, in order."""
    with psycopg.connect(ledger.dsn, connect_timeout=10) as conn:
        ledger.ensure(conn)
        conn.commit()
        with conn.transaction():
            # One redrive of a view at a time: the ledger is read and written under the lock.
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"tributary.redrive:{view}",)
            )
            before = ledger.done(conn, view)
            outcomes: dict[str, RedriveOutcome] = {}
            todo = []
            for letter in letters:
                if letter.id in before:
                    outcomes[letter.id] = RedriveOutcome(letter.id, "already redriven")
                elif not letter.source_topic or letter.source_partition < 0:
                    outcomes[letter.id] = RedriveOutcome(
                        letter.id, "no source", detail="no tributary.source.* headers"
                    )
                else:
                    todo.append(letter)
            superseded = _superseded(kafka, todo)
            for letter in todo:
                if letter.id in superseded:
                    outcomes[letter.id] = RedriveOutcome(
                        letter.id, "superseded", detail=superseded[letter.id]
                    )
            appended = _append(kafka, [t for t in todo if t.id not in superseded], timeout)
            outcomes.update(appended)
            fresh = [outcomes[d.id] for d in letters if d.id not in before and d.id in outcomes]
            ledger.record(conn, view, [o for o in fresh if o.outcome != "already redriven"])
    return [outcomes[d.id] for d in letters]


def _superseded(kafka: KafkaConfig, letters: list[DeadLetterRecord]) -> dict[str, str]:
    """Dead letters of state (compacted) topics whose key has a later record on their
    partition: id -> the later record's offset."""
    admin = TopicAdmin(kafka)
    out: dict[str, str] = {}
    by_partition: dict[tuple[str, int], list[DeadLetterRecord]] = {}
    for letter in letters:
        by_partition.setdefault((letter.source_topic, letter.source_partition), []).append(letter)
    policies: dict[str, str] = {}
    for (topic, partition), group in by_partition.items():
        if topic not in policies:
            policies[topic] = admin.configs(topic).get("cleanup.policy", "delete")
        if "compact" not in policies[topic]:
            continue
        [info] = admin.describe([topic])
        end = next(p.end_offset for p in info.partitions if p.partition == partition)
        low = min(letter.source_offset for letter in group) + 1
        latest: dict[bytes | None, int] = {}
        for record in read_range(kafka, topic, partition, low, end):
            latest[record.key] = record.offset
        for letter in group:
            later = latest.get(letter.key, -1)
            if later > letter.source_offset:
                out[letter.id] = f"its key has a later record at {topic}:{partition}:{later}"
    return out


def _append(
    kafka: KafkaConfig, letters: list[DeadLetterRecord], timeout: float
) -> dict[str, RedriveOutcome]:
    if not letters:
        return {}
    originals = read_at(
        kafka, [(d.source_topic, d.source_partition, d.source_offset) for d in letters]
    )
    producer = idempotent_producer(kafka, {"linger.ms": 5})
    targets: dict[str, str] = {}
    details: dict[str, str] = {}
    failures: list[str] = []
    for letter in letters:
        original = originals.get(
            (letter.source_topic, letter.source_partition, letter.source_offset)
        )
        headers: list[tuple[str, str | bytes | None]] = []
        detail = "the dead letter's key and value (the source record is gone)"
        if original is not None and original.value == letter.value and original.key == letter.key:
            headers = [(k, v) for k, v in original.headers.items() if k != REDRIVEN_HEADER]
            detail = "the source record with its headers"
        headers.append((REDRIVEN_HEADER, f"{dlq_topic(letter.view)}:{letter.id}".encode()))

        def delivered(err: Any, msg: Any, letter_id: str = letter.id) -> None:
            if err is not None:
                failures.append(f"{letter_id}: {err}")
            else:
                targets[letter_id] = f"{msg.topic()}:{msg.partition()}:{msg.offset()}"

        producer.produce(
            letter.source_topic,
            key=letter.key,
            value=letter.value,
            partition=letter.source_partition,
            headers=headers,
            on_delivery=delivered,
        )
        producer.poll(0)
        details[letter.id] = detail
    left = producer.flush(timeout)
    if failures or left:
        raise DeadLetterError(
            f"redrive of {len(letters)} dead letters not acknowledged ({left} unsent, errors:"
            f" {failures[:3]}): nothing was recorded; run the redrive again (the view's position"
            " guards drop any copy that did arrive)"
        )
    return {d.id: RedriveOutcome(d.id, "redriven", targets[d.id], details[d.id]) for d in letters}


def since_seconds(text: str, now: float | None = None) -> float:
    """``--since``: a duration back from now (``90s``, ``15m``, ``2h``, ``1d``) or an ISO-8601
    time; the Unix time it names."""
    now = time.time() if now is None else now
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip()
    if text and text[-1] in units and text[:-1].replace(".", "", 1).isdigit():
        return now - float(text[:-1]) * units[text[-1]]
    from datetime import UTC, datetime

    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise DeadLetterError(
            f"--since {text!r}: give a duration (90s, 15m, 2h, 1d) or an ISO-8601 time"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
