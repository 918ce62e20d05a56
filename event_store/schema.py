"""The store's tables in a schema of its own, append-only enforced by PostgreSQL itself.

``events`` is the outbox the CDC connector captures (primary key ``position``; rows are routed
by ``stream_type``, encoded with the Avro schema ``schema_id`` names; ``payload`` holds the
complete record value of a typed event, which a trigger completes at insert with the ``_meta``
envelope, so Debezium's EventRouter on Kafka Connect can publish it as is). A trigger rejects
UPDATE, DELETE and TRUNCATE for every role, owner included, and :func:`grant_application_role`
gives the application only SELECT and INSERT on it. ``transaction_id`` is the writer's
transaction id (``pg_current_xact_id()``), which :meth:`EventStore.read_all` uses to order and
to hold readers back behind running writers. ``published_streams`` is where the CDC connector
records, per stream, the last published version and the Kafka topic, partition and offset of its
record (updated in place).
"""

import re

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    DateTime,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    Uuid,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

DEFAULT_SCHEMA = "event_store"
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_identifier(name: str) -> str:
    """``name`` if it is a plain lower-case SQL identifier (we interpolate it into DDL)."""
    if not _IDENTIFIER.match(name):
        raise ValueError(f"{name!r} is not a plain identifier ([a-z_][a-z0-9_]*, <= 63 chars)")
    return name


class StoreTables:
    """SQLAlchemy Core tables of one store schema."""

    def __init__(self, schema: str = DEFAULT_SCHEMA) -> None:
        self.schema = check_identifier(schema)
        self.metadata = MetaData(schema=schema)
        self.events = Table(
            "events",
            self.metadata,
            Column("position", BigInteger, primary_key=True),
            Column("transaction_id", BigInteger, nullable=False),
            Column("event_id", Uuid, nullable=False),
            Column("stream_id", Text, nullable=False),
            Column("stream_type", Text, nullable=False),
            Column("version", Integer, nullable=False),
            Column("event_type", Text, nullable=False),
            Column("schema_version", Integer, nullable=False),
            Column("data", JSONB, nullable=False),
            Column("metadata", JSONB, nullable=False),
            Column("recorded_at", DateTime(timezone=True), nullable=False),
            Column("schema_id", Integer, nullable=True),
            Column("payload", LargeBinary, nullable=True),
        )
        self.snapshots = Table(
            "snapshots",
            self.metadata,
            Column("stream_id", Text, primary_key=True),
            Column("stream_type", Text, nullable=False),
            Column("version", Integer, nullable=False),
            Column("snapshot_version", Integer, nullable=False),
            Column("state", JSONB, nullable=False),
            Column("taken_at", DateTime(timezone=True), nullable=False),
        )
        self.commands = Table(
            "commands",
            self.metadata,
            Column("command_id", Text, primary_key=True),
            Column("command_type", Text, nullable=False),
            Column("stream_id", Text),
            Column("result", JSONB, nullable=False),
            Column("recorded_at", DateTime(timezone=True), nullable=False),
        )
        self.published_streams = Table(
            "published_streams",
            self.metadata,
            Column("stream_id", Text, primary_key=True),
            Column("stream_type", Text, nullable=False),
            Column("version", Integer, nullable=False),
            Column("topic", Text, nullable=False),
            Column("partition", Integer, nullable=False),
            Column("offset", BigInteger, nullable=False),
            Column("published_at", DateTime(timezone=True), nullable=False),
        )
        self.consumer_positions = Table(
            "consumer_positions",
            self.metadata,
            Column("consumer", Text, primary_key=True),
            Column("topic", Text, primary_key=True),
            Column("partition", Integer, primary_key=True),
            Column("next_offset", BigInteger, nullable=False),
            Column("updated_at", DateTime(timezone=True), nullable=False),
        )


def _ddl(schema: str) -> list[str]:
    s = check_identifier(schema)
    return [
        f"CREATE SCHEMA IF NOT EXISTS {s}",
        f"""
        CREATE TABLE IF NOT EXISTS {s}.events (
            position        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            transaction_id  bigint NOT NULL DEFAULT (pg_current_xact_id()::text::bigint),
            event_id        uuid NOT NULL,
            stream_id       text NOT NULL,
            stream_type     text NOT NULL,
            version         integer NOT NULL CHECK (version > 0),
            event_type      text NOT NULL,
            schema_version  integer NOT NULL CHECK (schema_version > 0),
            data            jsonb NOT NULL,
            metadata        jsonb NOT NULL DEFAULT '{{}}',
            recorded_at     timestamptz NOT NULL DEFAULT now(),
            schema_id       integer,
            CONSTRAINT events_stream_version_key UNIQUE (stream_id, version),
            CONSTRAINT events_event_id_key UNIQUE (event_id)
        )""",
        # The Avro schema's id in the schema registry (typed events; NULL: untyped), which
        # the CDC outbox encodes the row with. Added to stores created before typed events.
        f"ALTER TABLE {s}.events ADD COLUMN IF NOT EXISTS schema_id integer",
        # The event's Kafka record value, complete (Confluent wire format, ``_meta`` included):
        # what the CDC outbox publishes as is, embedded or on Kafka Connect (Debezium's
        # EventRouter). The writer inserts the header and the Avro body of the event's own
        # fields; the trigger below appends ``_meta``, whose position and time exist only once
        # the row does. NULL: untyped events and rows older than the column.
        f"ALTER TABLE {s}.events ADD COLUMN IF NOT EXISTS payload bytea",
        f"""
        CREATE OR REPLACE FUNCTION {s}.avro_long(n bigint) RETURNS bytea
        LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
        DECLARE
            z bigint := (n << 1) # (n >> 63);
            out bytea := '';
        BEGIN
            WHILE z < 0 OR z > 127 LOOP
                out := out || set_byte(decode('00', 'hex'), 0, ((z & 127) | 128)::integer);
                z := (z >> 7) & 144115188075855871;
            END LOOP;
            RETURN out || set_byte(decode('00', 'hex'), 0, z::integer);
        END
        $$""",
        f"""
        CREATE OR REPLACE FUNCTION {s}.avro_string(t text) RETURNS bytea
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
            SELECT {s}.avro_long(octet_length(convert_to(t, 'UTF8'))) || convert_to(t, 'UTF8')
        $$""",
        # The Avro encoding of io.tributary.EventMeta (connectors.avro.EVENT_META_SCHEMA),
        # field by field in its order.
        f"""
        CREATE OR REPLACE FUNCTION {s}.complete_event_payload() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            NEW.payload := NEW.payload
                || {s}.avro_string(NEW.event_id::text)
                || {s}.avro_string(NEW.event_type)
                || {s}.avro_long(NEW.schema_version)
                || {s}.avro_string(NEW.stream_type)
                || {s}.avro_string(NEW.stream_id)
                || {s}.avro_long(NEW.version)
                || {s}.avro_long(NEW.position)
                || {s}.avro_long((extract(epoch FROM NEW.recorded_at) * 1000000)::bigint)
                || {s}.avro_string(NEW.metadata::text);
            RETURN NEW;
        END
        $$""",
        f"CREATE OR REPLACE TRIGGER events_payload BEFORE INSERT ON {s}.events "
        f"FOR EACH ROW WHEN (NEW.payload IS NOT NULL) "
        f"EXECUTE FUNCTION {s}.complete_event_payload()",
        f"CREATE INDEX IF NOT EXISTS events_transaction_position_idx "
        f"ON {s}.events (transaction_id, position)",
        f"""
        CREATE OR REPLACE FUNCTION {s}.reject_event_change() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION '% on %.% is not allowed: events are append-only', TG_OP,
                TG_TABLE_SCHEMA, TG_TABLE_NAME
                USING HINT = 'append a compensating event instead', ERRCODE = 'TR001';
        END
        $$""",
        f"CREATE OR REPLACE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON {s}.events "
        f"FOR EACH ROW EXECUTE FUNCTION {s}.reject_event_change()",
        f"CREATE OR REPLACE TRIGGER events_no_truncate BEFORE TRUNCATE ON {s}.events "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {s}.reject_event_change()",
        f"REVOKE ALL ON {s}.events FROM PUBLIC",
        f"""
        CREATE TABLE IF NOT EXISTS {s}.snapshots (
            stream_id         text PRIMARY KEY,
            stream_type       text NOT NULL,
            version           integer NOT NULL,
            snapshot_version  integer NOT NULL,
            state             jsonb NOT NULL,
            taken_at          timestamptz NOT NULL DEFAULT now()
        )""",
        f"""
        CREATE TABLE IF NOT EXISTS {s}.commands (
            command_id    text PRIMARY KEY,
            command_type  text NOT NULL,
            stream_id     text,
            result        jsonb NOT NULL,
            recorded_at   timestamptz NOT NULL DEFAULT now()
        )""",
        f"""
        CREATE TABLE IF NOT EXISTS {s}.consumer_positions (
            consumer     text NOT NULL,
            topic        text NOT NULL,
            partition    integer NOT NULL,
            next_offset  bigint NOT NULL,
            updated_at   timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (consumer, topic, partition)
        )""",
        # Where each stream's latest published event landed on Kafka, written by the CDC
        # publisher once Kafka acknowledged it; read-your-writes waits compare view offsets
        # with it. Not captured by CDC (the connector's publication lists its tables).
        f"""
        CREATE TABLE IF NOT EXISTS {s}.published_streams (
            stream_id     text PRIMARY KEY,
            stream_type   text NOT NULL,
            version       integer NOT NULL,
            topic         text NOT NULL,
            partition     integer NOT NULL,
            "offset"      bigint NOT NULL,
            published_at  timestamptz NOT NULL DEFAULT now()
        )""",
        # One AES-256-GCM key per data subject (event_store.personal): personal fields of
        # events are stored and published encrypted with it. Forgetting the subject sets
        # ``key`` to NULL and ``forgotten_at``: the row stays, as the record that it was
        # forgotten (no personal data in it). Not captured by CDC.
        f"""
        CREATE TABLE IF NOT EXISTS {s}.subject_keys (
            subject_type  text NOT NULL,
            subject_id    text NOT NULL,
            key           bytea,
            created_at    timestamptz NOT NULL DEFAULT now(),
            forgotten_at  timestamptz,
            PRIMARY KEY (subject_type, subject_id),
            CHECK ((key IS NULL) = (forgotten_at IS NOT NULL))
        )""",
    ]


APPEND_ONLY_SQLSTATE = "TR001"


def create_schema(connection: Connection, schema: str = DEFAULT_SCHEMA) -> None:
    """Create the schema, tables, index and append-only triggers if absent (idempotent).

    Serialised by an advisory lock so concurrent creators do not trip over each other.
    """
    connection.execute(text("SELECT pg_advisory_xact_lock(hashtext(:s))"), {"s": schema})
    for statement in _ddl(schema):
        connection.execute(text(statement))


def grant_application_role(connection: Connection, role: str, schema: str = DEFAULT_SCHEMA) -> None:
    """Give ``role`` what the application needs and nothing more.

    Events and command records: SELECT and INSERT only (never UPDATE, DELETE, TRUNCATE).
    Snapshots and consumer positions are replaceable caches: full DML. Published streams:
    SELECT, INSERT, UPDATE (the CDC publisher upserts, read-your-writes waits read).
    """
    s, r = check_identifier(schema), check_identifier(role)
    for statement in [
        f"GRANT USAGE ON SCHEMA {s} TO {r}",
        f"GRANT SELECT, INSERT ON {s}.events, {s}.commands TO {r}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.snapshots, {s}.consumer_positions TO {r}",
        f"GRANT SELECT, INSERT, UPDATE ON {s}.published_streams TO {r}",
        f"GRANT SELECT, INSERT, UPDATE ON {s}.subject_keys TO {r}",
    ]:
        connection.execute(text(statement))


def drop_schema(connection: Connection, schema: str) -> None:
    """Drop a store schema and everything in it (tests, teardown of a demo)."""
    connection.execute(text(f"DROP SCHEMA IF EXISTS {check_identifier(schema)} CASCADE"))
