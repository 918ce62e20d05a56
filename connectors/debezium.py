"""Debezium PostgreSQL connector properties, for the embedded engine and for Kafka Connect.

One typed object yields both forms so a team can move from the embedded engine to a Kafka
Connect cluster with the same behaviour: :meth:`DebeziumPostgresConfig.connector_properties`
are the connector's own properties (what goes in Kafka Connect's ``config``), and
:meth:`DebeziumPostgresConfig.embedded_properties` adds what only the embedded engine needs
(offset storage in a local file, the JSON converter settings).
"""

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from connectors.postgres import PostgresConfig, SourceColumn
from connectors.stores.pg_tables import Encoding

SnapshotMode = Literal["initial", "no_data", "always", "initial_only", "when_needed", "never"]
CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
SIGNAL_SCHEMA = "tributary_cdc"
SIGNAL_TABLE = "debezium_signal"
HEARTBEAT_TABLE = "heartbeat"

_NAME = re.compile(r"^[a-z0-9_]{1,48}$")


@dataclass(frozen=True)
class DebeziumPostgresConfig:
    """What the connector captures, from where, and how it names things."""

    name: str
    database: PostgresConfig
    tables: tuple[str, ...]
    topic_prefix: str = "cdc"
    snapshot_mode: SnapshotMode = "initial"
    heartbeat_interval_ms: int = 10_000
    max_batch_size: int = 4096
    max_queue_size: int = 16384
    poll_interval_ms: int = 50
    offsets_file: Path | None = None
    outbox_table: str | None = "event_store.events"
    event_topic_prefix: str = "events."  # the outbox's events go to <prefix><stream_type>
    schema_wait_s: float = 60.0  # how long to wait at start for the event store's tables
    # the schema registry the outbox's events are encoded against (needed with an outbox)
    schema_registry_url: str | None = field(default=None, repr=False)
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(
                f"connector name {self.name!r} must be 1-48 lowercase letters, digits or "
                "underscores (it names the replication slot and the publication)"
            )
        for table in self.tables:
            if table.count(".") != 1:
                raise ValueError(f"table {table!r} must be written schema.table")
        if self.outbox_schema is not None and f"{self.outbox_schema}.published_streams" in (
            self.tables
        ):
            raise ValueError(
                f"{self.outbox_schema}.published_streams is the connector's own record of what "
                "it published: do not capture it"
            )

    @property
    def slot_name(self) -> str:
        return f"tributary_{self.name}"

    @property
    def publication_name(self) -> str:
        return f"tributary_{self.name}"

    @property
    def signal_table(self) -> str:
        return f"{SIGNAL_SCHEMA}.{SIGNAL_TABLE}"

    @property
    def heartbeat_table(self) -> str:
        return f"{SIGNAL_SCHEMA}.{HEARTBEAT_TABLE}"

    @property
    def heartbeat_topic(self) -> str:
        return f"__debezium-heartbeat.{self.topic_prefix}"

    @property
    def heartbeat_query(self) -> str:
        """Writes a row on every heartbeat so an idle database still moves the slot forward."""
        return (
            f"INSERT INTO {self.heartbeat_table} (connector, beat_at) "
            f"VALUES ('{self.name}', now()) "
            "ON CONFLICT (connector) DO UPDATE SET beat_at = EXCLUDED.beat_at"
        )

    @property
    def captured_tables(self) -> tuple[str, ...]:
        """The tables in the publication: the configured ones plus signal and heartbeat."""
        return (*self.tables, self.signal_table, self.heartbeat_table)

    @property
    def outbox_topic(self) -> str | None:
        """The CDC topic of the event store's table, when it is captured."""
        if self.outbox_table is None or self.outbox_table not in self.tables:
            return None
        return self.topic_for(self.outbox_table)

    @property
    def outbox_schema(self) -> str | None:
        """The event store's schema (where ``published_streams`` is), when the outbox is
        captured."""
        if self.outbox_topic is None or self.outbox_table is None:
            return None
        return self.outbox_table.split(".", 1)[0]

    @property
    def internal_topics(self) -> frozenset[str]:
        """Topics of Tributary's own tables, which are captured but never published."""
        return frozenset({self.topic_for(self.signal_table), self.topic_for(self.heartbeat_table)})

    def topic_for(self, table: str) -> str:
        return f"{self.topic_prefix}.{table}"

    def connector_properties(self) -> dict[str, str]:
        """The connector's properties, as Kafka Connect's ``config`` would hold them."""
        db = self.database
        props = {
            "connector.class": CONNECTOR_CLASS,
            "plugin.name": "pgoutput",
            "database.hostname": db.host,
            "database.port": str(db.port),
            "database.user": db.user,
            "database.password": db.password,
            "database.dbname": db.database,
            "topic.prefix": self.topic_prefix,
            "slot.name": self.slot_name,
            "publication.name": self.publication_name,
            "publication.autocreate.mode": "filtered",
            "table.include.list": ",".join(_regex_escape(t) for t in self.captured_tables),
            "snapshot.mode": self.snapshot_mode,
            "heartbeat.interval.ms": str(self.heartbeat_interval_ms),
            "heartbeat.action.query": self.heartbeat_query,
            "signal.data.collection": self.signal_table,
            "signal.enabled.channels": "source",
            "incremental.snapshot.chunk.size": "1024",
            "tombstones.on.delete": "true",
            "decimal.handling.mode": "string",
            "time.precision.mode": "adaptive_time_microseconds",
            "max.batch.size": str(self.max_batch_size),
            "max.queue.size": str(self.max_queue_size),
            "poll.interval.ms": str(self.poll_interval_ms),
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": "false",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter.schemas.enable": "false",
        }
        props.update(self.extra)
        return props

    def embedded_properties(self) -> dict[str, str]:
        """Connector properties plus the embedded engine's own (name, file offset store)."""
        if self.offsets_file is None:
            raise ValueError("the embedded engine needs offsets_file")
        props = self.connector_properties()
        props.update(
            {
                "name": self.name,
                "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
                "offset.storage.file.filename": str(self.offsets_file),
                "offset.flush.interval.ms": "0",
                "offset.flush.timeout.ms": "10000",
                "converter.schemas.enable": "false",
                "record.processing.order": "ORDERED",
                # A stop lets the batch in hand finish publishing and commit its offset (the
                # default, 10 s, can cut a slow publish short and re-deliver the batch).
                "record.processing.shutdown.timeout.ms": "30000",
            }
        )
        return props

    def kafka_connect_config(self, hide_password: bool = True) -> dict[str, object]:
        """The equivalent Kafka Connect connector JSON (``{"name", "config"}``)."""
        config = self.connector_properties()
        if hide_password and config["database.password"]:
            config["database.password"] = "${file:/opt/kafka/secrets/postgres.properties:password}"
        return {"name": self.name, "config": config}


def _regex_escape(table: str) -> str:
    """table.include.list entries are regular expressions: match the name exactly."""
    return table.replace(".", "\\.")


def debezium_encoding(column: SourceColumn) -> Encoding:
    """How Debezium's PostgreSQL connector writes this column's values in JSON (with
    ``time.precision.mode=adaptive_time_microseconds``, ``decimal.handling.mode=string``,
    ``interval.handling.mode=numeric``, ``binary.handling.mode=bytes``)."""
    name = column.type_name
    if column.category == "A":
        return "json_array"
    if name == "date":
        return "epoch_days"
    if name == "timestamp":
        precision = 6 if column.precision is None else column.precision
        return "epoch_millis" if precision <= 3 else "epoch_micros"
    if name == "time":
        return "micros_of_day"
    if name == "interval":
        return "micros_duration"
    if name in ("json", "jsonb"):
        return "json_text"
    if name == "bytea":
        return "base64"
    return "json"
