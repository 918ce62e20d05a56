"""Forgetting a data subject: destroy its key, record that it was forgotten.

:func:`forget` runs in ONE transaction: it locks the subject's key row, checks the
application's CDC-captured tables (``app_tables``: ``schema.table.column`` holding the
subject's id), and either

- refuses (``pending``) while any of them still holds a row of the subject, naming each
  table with its count and the SQL that deletes them: the application deletes
  its own rows (Debezium then publishes the deletes and their tombstones on the compacted
  ``cdc.*`` topics); nothing else changes, except that the subject's key row is created if
  it had none, so the next run knows the subject; or
- sets the key to NULL with ``forgotten_at`` and appends the audit event
  :class:`SubjectForgotten` (subject type and id, no personal data) to the stream
  ``<type>-<id>`` of stream type ``subject`` (topic ``events.subject``), which every view
  that may hold the subject reads to purge it within its next micro-batch.

Both writes commit together, so a ``kill -9`` in the middle leaves the subject either not
forgotten (run it again) or forgotten with its audit event. A subject already forgotten is
a no-op (``already``, with its audit event's position token, so a run after a crash that
came past the commit can still wait for the views); a key destroyed without its audit event
(by hand, or by an older version) gets the event appended now (``forgotten``). One no table
and no key knows is ``unknown`` and nothing changes.

``step`` (tests only) is called with each step's name as ``forget`` passes it
(:data:`FORGET_STEPS`): the crash tests stop the process there and ``kill -9`` it.
"""

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import Engine, text

from event_store.codec import to_json
from event_store.event import Event, NewEvent
from event_store.personal import new_key
from event_store.schema import check_identifier, create_schema
from event_store.store import EventStore

SUBJECT_STREAM_TYPE = "subject"

#: The points ``forget`` passes, in order: the subject checked (nothing written yet), the key
#: set to NULL, the audit event appended (both not committed yet), the transaction committed
#: (nothing told to the caller yet).
FORGET_STEPS = ("checked", "key_destroyed", "audit_appended", "committed")
StepHook = Callable[[str], None]


@dataclass(frozen=True)
class SubjectForgotten(Event, name="SubjectForgotten"):
    """A data subject was forgotten: its key is destroyed (no personal data here)."""

    subject_type: str
    subject_id: str
    forgotten_at: datetime


@dataclass(frozen=True)
class AppColumn:
    """A column of an application's table holding a subject's id."""

    table: str  # schema.table
    column: str

    @classmethod
    def parse(cls, text_: str) -> "AppColumn":
        parts = text_.strip().split(".")
        if len(parts) != 3:
            raise ValueError(f"{text_!r}: expected schema.table.column")
        for part in parts:
            check_identifier(part)
        return cls(f"{parts[0]}.{parts[1]}", parts[2])


def parse_app_tables(setting: str) -> dict[str, list[AppColumn]]:
    """``user=public.users.id;public.profiles.user_id,team=...`` -> columns by subject type
    (entries separated by commas, one subject type's columns by semicolons)."""
    out: dict[str, list[AppColumn]] = {}
    for entry in filter(None, (e.strip() for e in setting.split(","))):
        kind, _, columns = entry.partition("=")
        out.setdefault(kind.strip(), []).extend(
            AppColumn.parse(c) for c in columns.split(";") if c.strip()
        )
    return out


@dataclass(frozen=True)
class ForgetResult:
    status: Literal["forgotten", "already", "pending", "unknown"]
    subject_type: str
    subject_id: str
    remaining: list[tuple[str, int]] = field(default_factory=list)  # (table, rows)
    sql: list[str] = field(default_factory=list)  # what deletes them
    position: str | None = None  # the audit event's stream and version

    def as_json(self) -> dict[str, Any]:
        """What `tributary forget --json` prints and `POST /forget` answers."""
        return {
            "status": self.status,
            "subject_type": self.subject_type,
            "subject_id": self.subject_id,
            "message": self.message,
            "remaining": [{"table": t, "rows": n} for t, n in self.remaining],
            "sql": self.sql,
            "position_token": self.position,
        }

    @property
    def message(self) -> str:
        who = f"{self.subject_type} {self.subject_id}"
        if self.status == "forgotten":
            return f"{who} forgotten: key destroyed, SubjectForgotten appended ({self.position})"
        if self.status == "already":
            return f"{who} was already forgotten: nothing to do"
        if self.status == "unknown":
            return f"{who} is unknown (no key, no row in the captured tables): nothing changed"
        held = ", ".join(f"{t} ({n} rows)" for t, n in self.remaining)
        return (
            f"{who} is still held by the application's tables: {held}. Delete"
            " them (the deletes tombstone their cdc.* keys), then run forget again:\n"
            + "\n".join(self.sql)
        )


#: A subject type is a lower-case word (it names a stream: ``<type>-<id>``); an id is any
#: text without NUL (PostgreSQL's text cannot hold it).
SUBJECT_TYPE = r"^[a-z][a-z0-9_]*$"
SUBJECT_ID = r"^[^\x00]+$"


def check_subject(subject_type: str, subject_id: str) -> None:
    """A ValueError naming what is wrong with ``(subject_type, subject_id)``."""
    if not re.fullmatch(SUBJECT_TYPE, subject_type):
        raise ValueError(
            f"subject type {subject_type!r} is not a lower-case word ([a-z][a-z0-9_]*)"
        )
    if not subject_id or "\x00" in subject_id:
        raise ValueError("a subject id is text without NUL, at least one character")


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def forget(
    engine: Engine,
    schema: str,
    subject_type: str,
    subject_id: str,
    app_columns: Sequence[AppColumn] = (),
    now: datetime | None = None,
    step: StepHook | None = None,
) -> ForgetResult:
    """Forget ``(subject_type, subject_id)`` (see the module's doc)."""
    check_subject(subject_type, subject_id)
    s = check_identifier(schema)
    store = EventStore(engine, schema)
    passed = step or (lambda _name: None)
    stream = f"{subject_type}-{subject_id}"
    with engine.begin() as conn:
        create_schema(conn, s)  # idempotent: a store that never ran forgets too
        conn.execute(
            text("SELECT pg_advisory_xact_lock(hashtext(:k))"),
            {"k": f"forget:{subject_type}:{subject_id}"},
        )
        row = conn.execute(
            text(
                f"SELECT key IS NULL FROM {s}.subject_keys"
                " WHERE subject_type = :t AND subject_id = :i FOR UPDATE"
            ),
            {"t": subject_type, "i": subject_id},
        ).first()
        destroyed = row is not None and bool(row[0])
        version = store.stream_version(stream, conn)
        if destroyed and version > 0:
            return ForgetResult(
                "already",
                subject_type,
                subject_id,
                position=f"{SUBJECT_STREAM_TYPE}/{stream}@{version}",
            )
        remaining, sql = [], []
        for col in app_columns if not destroyed else ():
            table = ".".join(f'"{p}"' for p in col.table.split("."))
            if conn.execute(text("SELECT to_regclass(:t)"), {"t": table}).scalar() is None:
                continue  # no such table (yet): it holds nothing of the subject
            count = conn.execute(
                text(f'SELECT count(*) FROM {table} WHERE "{col.column}"::text = :i'),
                {"i": subject_id},
            ).scalar_one()
            if count:
                remaining.append((col.table, int(count)))
                sql.append(
                    f'DELETE FROM {table} WHERE "{col.column}"::text = {_literal(subject_id)};'
                )
        if remaining:
            if row is None:  # known from now on, so the run after the deletes finds it
                conn.execute(
                    text(
                        f"INSERT INTO {s}.subject_keys (subject_type, subject_id, key)"
                        " VALUES (:t, :i, :k) ON CONFLICT DO NOTHING"
                    ),
                    {"t": subject_type, "i": subject_id, "k": new_key()},
                )
            return ForgetResult("pending", subject_type, subject_id, remaining, sql)
        if row is None:
            return ForgetResult("unknown", subject_type, subject_id)
        passed("checked")
        if not destroyed:
            conn.execute(
                text(
                    f"UPDATE {s}.subject_keys SET key = NULL, forgotten_at = now()"
                    " WHERE subject_type = :t AND subject_id = :i"
                ),
                {"t": subject_type, "i": subject_id},
            )
        passed("key_destroyed")
        event = SubjectForgotten(subject_type, subject_id, now or datetime.now(UTC))
        store.append(
            stream,
            [NewEvent(event.event_name, to_json(event), metadata={"by": "tributary forget"})],
            version,
            stream_type=SUBJECT_STREAM_TYPE,
            connection=conn,
        )
        passed("audit_appended")
    passed("committed")
    return ForgetResult(
        "forgotten",
        subject_type,
        subject_id,
        position=f"{SUBJECT_STREAM_TYPE}/{stream}@{version + 1}",
    )


__all__ = [
    "FORGET_STEPS",
    "SUBJECT_ID",
    "SUBJECT_STREAM_TYPE",
    "SUBJECT_TYPE",
    "AppColumn",
    "ForgetResult",
    "StepHook",
    "SubjectForgotten",
    "check_subject",
    "forget",
    "parse_app_tables",
]
