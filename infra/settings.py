"""Tributary's settings: the only place that reads the environment.

Values come, highest priority first, from keyword arguments, ``TRIBUTARY_*``
environment variables, the TOML file named by ``TRIBUTARY_CONFIG_FILE`` (default
``./tributary.toml`` when present), then the defaults below. Lower layers receive
small config objects built here (:meth:`Settings.kafka`, ...), never the settings.
"""

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from connectors.debezium import DebeziumPostgresConfig
from connectors.kafka.config import KafkaConfig
from connectors.postgres import PostgresConfig

CONFIG_FILE_ENV = "TRIBUTARY_CONFIG_FILE"
DEFAULT_CONFIG_FILE = "tributary.toml"


class Settings(BaseSettings):
    """Typed, frozen settings. Every field maps to ``TRIBUTARY_<FIELD>`` in upper case."""

    model_config = SettingsConfigDict(env_prefix="TRIBUTARY_", frozen=True, extra="ignore")

    home: Path = Field(Path(".tributary"), description="State folder of the local stack.")

    # Local stack ports (all bound to 127.0.0.1).
    postgres_port: int = Field(15432, description="Local PostgreSQL port.")
    broker_port: int = Field(19092, description="Local Kafka-protocol broker (Tansu) port.")
    redis_port: int = Field(16379, description="Local Redis port.")
    objectstore_port: int = Field(18333, description="Local SeaweedFS S3 gateway port.")
    objectstore_internal_port: int = Field(
        18340,
        description="First of 7 consecutive ports SeaweedFS uses inside (master, volume, filer).",
    )

    # Binaries.
    postgres_bin_dir: Path = Field(
        Path("/usr/lib/postgresql/15/bin"), description="PostgreSQL 15 server binaries."
    )
    redis_server_bin: str = Field("redis-server", description="redis-server executable.")

    # External endpoints: when set, Tributary uses them instead of the local stack.
    kafka_bootstrap_servers: str | None = Field(
        None, description="Kafka bootstrap servers of an existing cluster."
    )
    postgres_url: str | None = Field(
        None, description="SQLAlchemy URL of an existing PostgreSQL (postgresql+psycopg://...)."
    )
    redis_url: str | None = Field(None, description="URL of an existing Redis (redis://...).")
    spark_master: str = Field("local[2]", description="Spark master URL.")

    postgres_wal_budget_mb: int = Field(
        2048,
        description="max_slot_wal_keep_size of the local PostgreSQL: the WAL a replication slot"
        " may hold back (-1: unbounded).",
    )
    cdc_wal_warn_ratio: float = Field(
        0.8, description="Warn when a slot retains this share of the WAL budget."
    )
    start_timeout_s: float = Field(
        60.0, description="Seconds each local service may take to start."
    )

    # CDC (Debezium PostgreSQL connector, embedded engine).
    cdc_connector_name: str = Field(
        "tributary", description="Connector name; its slot and publication are tributary_<name>."
    )
    cdc_tables: Annotated[tuple[str, ...], NoDecode] = Field(
        ("public.users", "event_store.events"),
        description="Captured tables, comma-separated schema.table.",
    )
    cdc_topic_prefix: str = Field("cdc", description="Topics are <prefix>.<schema>.<table>.")
    cdc_snapshot_mode: Literal[
        "initial", "no_data", "always", "initial_only", "when_needed", "never"
    ] = Field("initial", description="Debezium snapshot.mode.")
    cdc_heartbeat_ms: int = Field(10_000, description="Debezium heartbeat.interval.ms.")
    cdc_topic_partitions: int = Field(1, description="Partitions of CDC topics it creates.")
    cdc_outbox_table: str = Field(
        "event_store.events",
        description="The event store's table: its rows go to events.<stream_type> in Avro.",
    )
    event_topic_prefix: str = Field(
        "events.", description="The event store's events go to <prefix><stream_type>."
    )
    cdc_replica_identity_full: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="Tables set to REPLICA IDENTITY FULL (full before-images)."
    )

    @field_validator("cdc_tables", "cdc_replica_identity_full", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = Path(os.environ.get(CONFIG_FILE_ENV, DEFAULT_CONFIG_FILE))
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if path.is_file():
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)

    # -- derived endpoints -------------------------------------------------------------

    @property
    def uses_local_stack(self) -> bool:
        return self.kafka_bootstrap_servers is None or self.postgres_url is None

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka_bootstrap_servers or f"127.0.0.1:{self.broker_port}"

    @property
    def database_url(self) -> str:
        return self.postgres_url or (
            f"postgresql+psycopg://postgres@127.0.0.1:{self.postgres_port}/tributary"
        )

    @property
    def cache_url(self) -> str:
        return self.redis_url or f"redis://127.0.0.1:{self.redis_port}/0"

    def kafka(self, client_id: str = "tributary") -> KafkaConfig:
        return KafkaConfig(bootstrap_servers=self.bootstrap_servers, client_id=client_id)

    def postgres(self) -> PostgresConfig:
        return PostgresConfig(url=self.database_url)

    @property
    def cdc_state_dir(self) -> Path:
        return self.home / "cdc"

    def debezium(self) -> DebeziumPostgresConfig:
        return DebeziumPostgresConfig(
            name=self.cdc_connector_name,
            database=self.postgres(),
            tables=self.cdc_tables,
            topic_prefix=self.cdc_topic_prefix,
            snapshot_mode=self.cdc_snapshot_mode,
            heartbeat_interval_ms=self.cdc_heartbeat_ms,
            outbox_table=self.cdc_outbox_table or None,
            event_topic_prefix=self.event_topic_prefix,
            offsets_file=(self.cdc_state_dir / f"{self.cdc_connector_name}.offsets").resolve(),
        )

    # Event store
    event_store_schema: str = Field("event_store", description="Schema of the event store.")
    event_store_snapshot_every: int = Field(
        100, description="Snapshot an aggregate every N events (0: never)."
    )
    event_store_max_retries: int = Field(
        5, description="Retries of a command after a concurrency conflict (fresh load each)."
    )
    commands_topic: str = Field("commands", description="Topic the command processor reads.")
    command_results_topic: str = Field(
        "command-results", description="Topic the command processor writes results to."
    )
    command_topic_partitions: int = Field(4, description="Partitions of both command topics.")
    command_processor_name: str = Field(
        "command-processor", description="Name under which the processor stores its offsets."
    )
    command_handlers: str = Field(
        "examples.social:social_registry",
        description="module:factory returning the CommandRegistry the processor serves.",
    )

    # Views
    mirror_tables: str = Field(
        "public.users",
        description="Tables mirrored into the views schema, comma-separated schema.table;"
        " each view reads the topic <cdc prefix>.<schema>.<table>.",
    )
    views_schema: str = Field(
        "views", description="PostgreSQL schema holding the views' tables and their ledger."
    )
    view_checkpoint_dir: Path | None = Field(
        None, description="Checkpoints of the view queries (default <home>/checkpoints)."
    )
    view_max_offsets_per_trigger: int | None = Field(
        50_000, description="Most offsets one micro-batch of a view reads (maxOffsetsPerTrigger)."
    )
    view_replay_max_offsets_per_trigger: int | None = Field(
        500_000, description="Most offsets one micro-batch of a replay reads."
    )
    view_trigger_interval_s: float = Field(1.0, description="Micro-batch interval of views.")
    views: str = Field(
        "examples.social.views:social_views",
        description="View factories (module:function, comma-separated) whose views run beside"
        " the mirrors.",
    )
    api_host: str = Field("127.0.0.1", description="Address the HTTP API listens on.")
    api_port: int = Field(18080, description="Port of the HTTP API (tributary serve).")
    index_dir: Path | None = Field(
        None, description="Folder of the search indexes (default <home>/indexes)."
    )
    spark_driver_memory: str = Field("1g", description="Memory of the views' Spark driver.")


def load_settings(**overrides: object) -> Settings:
    """Read the settings (environment, file, defaults), with explicit overrides on top."""
    return Settings(**overrides)  # type: ignore[arg-type]
