"""Debezium PostgreSQL connector properties, for the embedded engine and for Kafka Connect.

One typed object yields both forms so a team can move from the embedded engine to a Kafka
Connect cluster with the same behaviour: :meth:`DebeziumPostgresConfig.connector_properties`
are the connector's own properties (what goes in Kafka Connect's ``config``), and
:meth:`DebeziumPostgresConfig.embedded_properties` adds what only the embedded engine needs
(offset storage in a local file, the JSON converter settings).
:meth:`DebeziumPostgresConfig.kafka_connect_config` splits it in two Connect connectors, the
tables and the event store's outbox (Debezium's ``EventRouter`` publishing the rows' ``payload``
as is), since a Connect connector has one value converter.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from connectors.postgres import PostgresConfig, SourceColumn

if TYPE_CHECKING:  # (psycopg, which it imports, is not needed in Spark's Python workers)
    from connectors.stores.pg_tables import Encoding

ChangeFormat = Literal["json", "avro"]
AVRO_CONVERTER = "io.confluent.connect.avro.AvroConverter"
FILTER = "org.apache.kafka.connect.transforms.Filter"
TOPIC_MATCHES = "org.apache.kafka.connect.transforms.predicates.TopicNameMatches"
SnapshotMode = Literal["initial", "no_data", "always", "initial_only", "when_needed", "never"]
CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
SIGNAL_SCHEMA = "tributary_cdc"
SIGNAL_TABLE = "debezium_signal"
HEARTBEAT_TABLE = "heartbeat"
OUTBOX_SUFFIX = "_outbox"
#: The event row's columns the outbox connector copies into headers of the same name (the
#: embedded outbox's headers; see :mod:`cdc.outbox`).
OUTBOX_HEADERS = ("event_type", "event_id", "version", "schema_version", "position")

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
        return self._heartbeat_query(self.name)

    def _heartbeat_query(self, connector: str) -> str:
        return (
            f"INSERT INTO {self.heartbeat_table} (connector, beat_at) "
            f"VALUES ('{connector}', now()) "
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

    @property
    def outbox_connector_name(self) -> str:
        """The name of the outbox connector of the Kafka Connect export."""
        return f"{self.name}{OUTBOX_SUFFIX}"

    def outbox_connector_properties(self) -> dict[str, str]:
        """A Kafka Connect connector that publishes the event store's rows as the embedded
        outbox does: Debezium's ``EventRouter`` routes each row to
        ``<event_topic_prefix><stream_type>`` with the stream id as key, the row's ``payload``
        column (the complete Confluent wire-format value the store wrote) as value and the
        event's identity as headers; the converters pass the bytes through. Its own slot and
        publication; a heartbeat keeps the slot moving while no event is appended (a filter
        drops the heartbeat's records, which have no event)."""
        if self.outbox_table is None or self.outbox_topic is None:
            raise ValueError("the outbox table is not captured: there is no outbox connector")
        name = self.outbox_connector_name
        slot = f"tributary_{name}"
        if len(slot) > 63:
            raise ValueError(f"slot name {slot!r} is longer than PostgreSQL's 63 characters")
        props = self.connector_properties()
        for key in (
            "signal.data.collection",
            "signal.enabled.channels",
            "incremental.snapshot.chunk.size",
        ):
            props.pop(key, None)
        headers = ",".join(f"{column}:header:{column}" for column in OUTBOX_HEADERS)
        props.update(
            {
                "slot.name": slot,
                "publication.name": slot,
                "table.include.list": ",".join(
                    _regex_escape(t) for t in (self.outbox_table, self.heartbeat_table)
                ),
                "heartbeat.action.query": self._heartbeat_query(name),
                "tombstones.on.delete": "false",
                "transforms": "events,outbox",
                "transforms.events.type": FILTER,
                "transforms.events.predicate": "isEvents",
                "transforms.events.negate": "true",
                "predicates": "isEvents",
                "predicates.isEvents.type": TOPIC_MATCHES,
                "predicates.isEvents.pattern": re.escape(self.outbox_topic),
                "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
                "transforms.outbox.table.field.event.id": "event_id",
                "transforms.outbox.table.field.event.key": "stream_id",
                "transforms.outbox.table.field.event.payload": "payload",
                "transforms.outbox.route.by.field": "stream_type",
                "transforms.outbox.route.topic.replacement": (
                    f"{self.event_topic_prefix}${{routedByValue}}"
                ),
                "transforms.outbox.table.fields.additional.placement": headers,
                "key.converter": "org.apache.kafka.connect.storage.StringConverter",
                "value.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
                "header.converter": "org.apache.kafka.connect.storage.SimpleHeaderConverter",
                # history topics, as the embedded publisher creates them (kept for ever)
                **_topic_creation("delete", retention_ms="-1"),
            }
        )
        for key in (
            "key.converter.schemas.enable",
            "value.converter.schemas.enable",
        ):
            props.pop(key, None)
        return props

    def tables_connector_properties(self, change_format: ChangeFormat = "json") -> dict[str, str]:
        """The Kafka Connect form of the embedded connector without the outbox table (the
        outbox connector publishes it). ``change_format="avro"``: keys and values in Avro
        through Confluent's ``AvroConverter`` against the schema registry (subjects
        ``<topic>-key`` and ``<topic>-value``), for Connect deployments whose consumers read
        Avro; Tributary's own views read the JSON form (the default, and the embedded one)."""
        props = self.connector_properties()
        if self.outbox_table is not None:
            captured = [t for t in self.captured_tables if t != self.outbox_table]
            props["table.include.list"] = ",".join(_regex_escape(t) for t in captured)
        # Tributary's own tables (signals, heartbeats) are captured but never published.
        internal = "|".join(re.escape(t) for t in sorted(self.internal_topics))
        props.update(
            {
                "transforms": "internal",
                "transforms.internal.type": FILTER,
                "transforms.internal.predicate": "isInternal",
                "predicates": "isInternal",
                "predicates.isInternal.type": TOPIC_MATCHES,
                "predicates.isInternal.pattern": internal,
                **_topic_creation("compact"),
            }
        )
        if change_format == "avro":
            if self.schema_registry_url is None:
                raise ValueError("Avro change events need the schema registry's URL")
            for side in ("key", "value"):
                props.pop(f"{side}.converter.schemas.enable", None)
                props[f"{side}.converter"] = AVRO_CONVERTER
                props[f"{side}.converter.schema.registry.url"] = self.schema_registry_url
        return props

    def kafka_connect_config(
        self, hide_password: bool = True, change_format: ChangeFormat = "json"
    ) -> list[dict[str, object]]:
        """The equivalent Kafka Connect connectors (each ``{"name", "config"}``, as
        ``POST /connectors`` takes it): the captured tables as change events (JSON, or Avro:
        :meth:`tables_connector_properties`), and, when the event store's table is captured,
        the outbox connector (:meth:`outbox_connector_properties`), since Kafka Connect
        converters are per connector. Without tables but the outbox, only the outbox one."""
        connectors: list[tuple[str, dict[str, str]]] = []
        if self.outbox_topic is None or any(t != self.outbox_table for t in self.tables):
            connectors.append((self.name, self.tables_connector_properties(change_format)))
        if self.outbox_topic is not None:
            connectors.append((self.outbox_connector_name, self.outbox_connector_properties()))
        exported: list[dict[str, object]] = []
        for name, config in connectors:
            if hide_password and config["database.password"]:
                config["database.password"] = (
                    "${file:/opt/kafka/secrets/postgres.properties:password}"
                )
            exported.append({"name": name, "config": config})
        return exported


def _topic_creation(cleanup: str, **extra: str) -> dict[str, str]:
    """Kafka Connect's settings for the topics a connector creates (the worker's
    ``topic.creation.enable``, true by default; the broker's defaults for the rest)."""
    props = {
        "topic.creation.default.replication.factor": "-1",
        "topic.creation.default.partitions": "-1",
        "topic.creation.default.cleanup.policy": cleanup,
    }
    props.update({f"topic.creation.default.{k.replace('_', '.')}": v for k, v in extra.items()})
    return props


def _regex_escape(table: str) -> str:
    """table.include.list entries are regular expressions: match the name exactly."""
    return table.replace(".", "\\.")


def debezium_encoding(column: SourceColumn) -> "Encoding":
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
