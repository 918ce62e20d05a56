"""Tributary's settings: the only place that reads the environment.

Values come, highest priority first, from keyword arguments, ``TRIBUTARY_*``
environment variables, the TOML file named by ``TRIBUTARY_CONFIG_FILE`` (default
``./tributary.toml`` when present), then the defaults below. Lower layers receive
small config objects built here (:meth:`Settings.kafka`, ...), never the settings.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from infra.settings_base import (
    SaslMechanism,
    SecurityProtocol,
    SettingsMethods,
    SnapshotMode,
    comma_list,
    empty_is_unset,
    key_values,
    spark_properties,
)
from infra.settings_file import config_file
from tributary.redact import redact


class Settings(SettingsMethods, BaseSettings):
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
    schema_registry_port: int = Field(
        18081, description="Local schema registry (Confluent REST API) port."
    )
    broker_storage: Literal["s3", "memory"] = Field(
        "s3",
        description=(
            "Where the local broker keeps its log: `s3` (the local object store: topics survive"
            " a restart) or `memory` (no object store; topics are lost when the broker stops;"
            " for throwaway stacks such as a test session)."
        ),
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
    schema_registry_url: str | None = Field(
        None,
        description="URL of an existing schema registry speaking Confluent's REST API"
        " (Confluent, Karapace, Apicurio, Redpanda); when set, `tributary up` starts none.",
    )
    schema_registry_topic: str = Field(
        "_schemas",
        description="Compacted topic the local schema registry stores its schemas in"
        " (Confluent's record format).",
    )
    views_read_url: str | None = Field(
        None,
        description="PostgreSQL URL of a read-only role (see `tributary grant-read-role`) the"
        " serving side (HTTP API, tributary query) reads the views' tables through (default:"
        " the main URL).",
    )
    spark_master: str = Field(
        "auto",
        description="Spark master URL of the view and analytics jobs (e.g. spark://host:7077)."
        " `auto`: the local stack's Spark cluster when `tributary up --spark-workers N` started"
        " one, else `local[2]` (Spark in the jobs' own process).",
    )
    spark_master_port: int = Field(17077, description="Port of the local stack's Spark master.")
    spark_master_ui_port: int = Field(
        17080, description="Web UI (and JSON state) port of the local stack's Spark master."
    )
    spark_worker_cores: int = Field(
        1, ge=1, description="Cores of each Spark worker `tributary up --spark-workers` starts."
    )
    spark_worker_memory: str = Field(
        "1g", description="Memory of each Spark worker `tributary up --spark-workers` starts."
    )

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
    cdc_snapshot_mode: SnapshotMode = Field("initial", description="Debezium snapshot.mode.")
    cdc_heartbeat_ms: int = Field(10_000, description="Debezium heartbeat.interval.ms.")
    cdc_topic_partitions: int = Field(1, description="Partitions of CDC topics it creates.")
    cdc_outbox_table: str = Field(
        "event_store.events",
        description="The event store's table: its rows go to events.<stream_type> in Avro.",
    )
    cdc_schema_wait_s: float = Field(
        60.0, description="How long CDC waits at start for the event store's tables."
    )
    event_topic_prefix: str = Field(
        "events.", description="The event store's events go to <prefix><stream_type>."
    )
    cdc_replica_identity_full: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="Tables set to REPLICA IDENTITY FULL (full before-images)."
    )

    # Security of an existing Kafka cluster: passed to every Kafka client (librdkafka names).
    kafka_security_protocol: SecurityProtocol | None = Field(
        None, description="security.protocol of every Kafka client (default: PLAINTEXT)."
    )
    kafka_sasl_mechanism: SaslMechanism | None = Field(None, description="sasl.mechanism.")
    kafka_sasl_username: str | None = Field(None, description="sasl.username.")
    kafka_sasl_password: SecretStr | None = Field(None, description="sasl.password.")
    kafka_ssl_ca_location: str | None = Field(
        None, description="ssl.ca.location: CA certificate(s) (PEM) that verify the brokers."
    )
    kafka_ssl_certificate_location: str | None = Field(
        None, description="ssl.certificate.location: the client's certificate (PEM, mutual TLS)."
    )
    kafka_ssl_key_location: str | None = Field(
        None, description="ssl.key.location: the client's private key (PEM, mutual TLS)."
    )
    kafka_ssl_key_password: SecretStr | None = Field(
        None, description="ssl.key.password: passphrase of the client's private key."
    )
    kafka_extra: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="More librdkafka properties for every Kafka client, comma-separated"
        " key=value (e.g. sasl.oauthbearer.method=oidc,socket.timeout.ms=30000).",
    )
    kafka_admin_timeout_s: float = Field(
        15.0,
        gt=0,
        description="How long a Kafka metadata or topic call (status, views, topic creation)"
        " waits for the brokers before it fails with 'cannot reach Kafka'.",
    )

    # Who may do what (the HTTP API).
    api_token: SecretStr | None = Field(
        None, description="Bearer token POST /commands requires (unset: commands are open)."
    )
    api_read_token: SecretStr | None = Field(
        None,
        description="Bearer token the GET query routes require (unset: reads are open);"
        " /health and /docs stay open, and the command token also reads.",
    )

    @field_validator("api_token", "api_read_token", "kafka_sasl_password", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return empty_is_unset(value)

    @field_validator("kafka_extra", mode="before")
    @classmethod
    def _key_values(cls, value: object) -> object:
        return key_values(value)

    @field_validator("spark_conf", mode="before")
    @classmethod
    def _spark_properties(cls, value: object) -> object:
        return spark_properties(value)

    @model_validator(mode="after")
    def _check_kafka_security(self) -> "Settings":
        self.check_kafka_security()
        return self

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            yield name, redact(value) if isinstance(value, str) else value

    @field_validator("cdc_tables", "cdc_replica_identity_full", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        return comma_list(value)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = config_file()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if path.is_file():
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)

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
    command_owner_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Seconds after its last heartbeat a paused command processor loses its"
        " partitions to the others (a dead one loses them at once).",
    )
    command_max_poll_interval_s: float = Field(
        300.0,
        gt=0,
        description="Seconds a command processor's loop may go without polling (a handler that"
        " hangs) before its heartbeat stops and its partitions expire to the others (Kafka's"
        " max.poll.interval.ms).",
    )
    command_results_linger_ms: int = Field(
        5,
        ge=0,
        le=30_000,
        description="Milliseconds the command processor's results producer waits to batch"
        " results (librdkafka's linger.ms; at most 30000, half its transactions' timeout); a"
        " batch's results are sent at its end anyway.",
    )
    command_results_exactly_once: bool = Field(
        False,
        description="Each command processor's results go through a transactional producer per"
        " owned partition, fenced by the next owner: a paused processor's held result is"
        " refused when it wakes, never a second answer (Kafka Streams' exactly_once_v2; adds"
        " about a second to a take-over).",
    )
    command_handlers: str = Field(
        "examples.social:social_registry",
        description="module:factory returning the CommandRegistry the processor serves.",
    )
    cli_plugins: str = Field(
        "examples.social.activity_cli:activity_app",  # = infra.plugins.DEFAULT_CLI_PLUGINS
        description="Typer apps (module:app, comma-separated) the CLI adds as commands; the"
        " default adds the demo domain's `tributary activity`.",
    )
    demo: str = Field(
        "examples.social.demo:run_demo",
        description="module:function `tributary demo` runs (settings, console) -> every check"
        " held.",
    )

    forget_tables: str = Field(
        "user=public.users.id",
        description="The application's CDC-captured columns holding each subject type's id,"
        " `type=schema.table.column[;...]`, comma-separated: `tributary forget` refuses, printing"
        " the DELETEs, while any of them still holds a row of the subject.",
    )
    forget_step_hook: str = Field(
        "",
        description="Tests only: module:function `tributary forget` calls with the name of"
        " each step it passes (checked, key_destroyed, audit_appended, committed): the crash"
        " test stops the process there and kills it. Empty: none.",
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
    views_share_query: bool = Field(
        True,
        description="Views that fold per partition (the mirrors, search, profile, timeline) run"
        " as one streaming query that reads their topics once; false: one query per view.",
    )
    views_standby: bool = Field(
        False,
        description="`tributary run` also starts a second views process that waits, its Spark"
        " session warm, and takes over each view the moment the first one dies (its lease is"
        " freed). Off by default, as Kafka Streams' standby replicas: it costs a second driver.",
    )
    views: str = Field(
        "examples.social.views:social_views",
        description="View factories (module:function, comma-separated) whose views run beside"
        " the mirrors.",
    )
    analytics: str = Field(
        "",
        description="Analytics job factories (module:function, comma-separated) run beside the"
        " views, e.g. examples.social.analytics:social_analytics (none by default: each job is a"
        " stateful Spark query).",
    )
    activity_topic: str = Field(
        "activity", description="Topic of the raw activity stream (key = session id)."
    )
    analytics_topic_prefix: str = Field(
        "analytics.", description="Prefix of the topics the analytics jobs publish to."
    )
    allowed_lateness_s: float = Field(
        300.0,
        ge=0,
        description="Allowed lateness of analytics records (receive time minus corrected event"
        " time); later ones are counted in each job's `late` collection, not in windows.",
    )
    lateness_slack_s: float = Field(
        600.0,
        ge=0,
        description="How long beyond the allowed lateness Spark keeps analytics state (the"
        " watermark delay is lateness + slack).",
    )
    verify_interval_s: float = Field(
        300.0, description="How often `tributary run` runs verify (0: never)."
    )
    api_host: str = Field("127.0.0.1", description="Address the HTTP API listens on.")
    api_port: int = Field(18080, description="Port of the HTTP API (tributary serve).")

    # Each long-running part serves its own Prometheus metrics (GET /metrics; 0: none).
    metrics_host: str = Field(
        "127.0.0.1", description="Address the parts' metrics endpoints listen on."
    )
    cdc_metrics_port: int = Field(
        18091, ge=0, le=65535, description="Metrics port of `tributary run cdc`."
    )
    commands_metrics_port: int = Field(
        18092, ge=0, le=65535, description="Metrics port of `tributary run commands`."
    )
    views_metrics_port: int = Field(
        18093, ge=0, le=65535, description="Metrics port of `tributary run views`."
    )
    views_standby_metrics_port: int = Field(
        18094, ge=0, le=65535, description="Metrics port of the standby views process."
    )
    index_dir: Path | None = Field(
        None, description="Folder of the search indexes (default <home>/indexes)."
    )
    spark_driver_memory: str = Field("1g", description="Memory of the views' Spark driver.")
    spark_java_options: str = Field(
        "",
        description="Extra JVM options of the Spark driver and executors (Spark's"
        " extraJavaOptions; and of the stack's own master and workers), e.g."
        " `-XX:TieredStopAtLevel=1 -XX:+UseSerialGC`: on a small machine a driver then starts"
        " in about half the time (the test suite uses them).",
    )
    spark_conf: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="More Spark properties for every session the views and analytics start, as"
        ' a JSON object (`{"spark.executor.memory": "2g"}`) or comma-separated key=value'
        " (`spark.executor.memory=2g,spark.cores.max=2`), e.g. executor sizes or the Python of"
        " the executors and of Spark's Python processes on the driver (`spark.pyspark.python`).",
    )
    cdc_java_options: str = Field(
        "",
        description="Extra JVM options of the CDC part's Debezium engine, e.g."
        " `-XX:TieredStopAtLevel=1 -XX:+UseSerialGC`: on a small machine its JVM then starts"
        " with less CPU (the test suite uses them). A collector named here replaces the"
        " engine's G1.",
    )
    cdc_class_archive: Path | None = Field(
        None,
        description="Class-data archive of the CDC part's Debezium JVM (AppCDS), written by"
        " `tributary cdc-archive` and `make setup`: the engine maps its classes from it and"
        " starts with less CPU. Default <venv>/share/tributary/cdc-classes.jsa; a missing or"
        " stale file is skipped.",
    )
    cdc_publisher: Literal["jvm", "python"] = Field(
        "jvm",
        description="Who produces the CDC part's table changes to Kafka: `jvm`, Kafka's Java"
        " producer inside the Debezium engine's JVM (a batch crosses to Python once; needs the"
        " JDK's `javac` once, `make setup` compiles it), or `python`, every change through"
        " Python's producer. The outbox's events always go through Python (schema registry).",
    )
    spark_class_archive: Path | None = Field(
        None,
        description="Class-data archive of the Spark driver's JVM (AppCDS), written by"
        " `tributary spark-archive` and `make setup`: a driver maps Spark's classes from it and"
        " starts about 5 s sooner. Default <venv>/share/tributary/spark-classes.jsa; a missing"
        " or stale file is skipped.",
    )


def load_settings(**overrides: object) -> Settings:
    """Read the settings (environment, file, defaults), with explicit overrides on top."""
    return Settings(**overrides)  # type: ignore[arg-type]


def settings_problems(exc: ValidationError) -> str:
    """What is wrong with the settings, one problem per line, naming the variables and never
    quoting a value (pydantic's own message quotes the inputs, passwords included)."""
    lines = []
    for problem in exc.errors(include_input=False, include_url=False):
        names = [str(part) for part in problem.get("loc", ()) if isinstance(part, str)]
        where = f"TRIBUTARY_{names[0].upper()}" if names else "settings"
        message = str(problem.get("msg", "invalid")).removeprefix("Value error, ")
        lines.append(f"{where}: {redact(message)}")
    return "; ".join(lines) or "invalid settings"


def light_fields() -> dict[str, tuple[str, bool, object, tuple[object, ...]]]:
    """Each field as :data:`infra.settings_light.FIELDS` describes it (kind, optional, default,
    bounds or choices): the light loader's table, derived from this model (a unit test holds
    the two equal; print this to regenerate the table)."""
    import types
    import typing

    from annotated_types import Ge, Gt, Le

    kinds: dict[object, str] = {
        str: "str",
        int: "int",
        float: "float",
        bool: "bool",
        Path: "path",
        SecretStr: "secret",
        tuple[str, ...]: "strings",
        dict[str, str]: "pairs",
    }
    table: dict[str, tuple[str, bool, object, tuple[object, ...]]] = {}
    for name, field in Settings.model_fields.items():
        annotation = field.annotation
        args = typing.get_args(annotation)
        optional = typing.get_origin(annotation) in (typing.Union, types.UnionType) and (
            type(None) in args
        )
        if optional:
            (annotation,) = [a for a in args if a is not type(None)]
        extra: tuple[object, ...] = ()
        if typing.get_origin(annotation) is Literal:
            kind, extra = "choice", typing.get_args(annotation)
        elif name == "spark_conf":  # Spark's properties: JSON or key=value, their own checks
            kind = "spark"
        else:
            kind = kinds[annotation]
        for bound in field.metadata:
            if isinstance(bound, Gt):
                extra += (("gt", bound.gt),)
            elif isinstance(bound, Ge):
                extra += (("ge", bound.ge),)
            elif isinstance(bound, Le):
                extra += (("le", bound.le),)
        default = field.get_default(call_default_factory=True)
        table[name] = (kind, optional, default, extra)
    return table
