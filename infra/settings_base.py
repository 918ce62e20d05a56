"""What the settings compute from their values, without pydantic: the endpoints and config
objects derived from the fields, the parsing of the comma-separated variables and the checks of
Kafka's security settings.

:class:`infra.settings.Settings` (pydantic) and :class:`infra.settings_light.LightSettings`
(what ``tributary status`` loads: pydantic-settings and pydantic cost ~0.25 s of its start)
both inherit :class:`SettingsMethods`, so both compute and check alike.
"""

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from connectors.kafka.config import KafkaConfig, is_secret_property
from connectors.postgres import PostgresConfig
from tributary.redact import register_secret, url_password

if TYPE_CHECKING:  # imported where used: the CLI's start does not pay for them
    from connectors.debezium import DebeziumPostgresConfig

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
SnapshotMode = Literal["initial", "no_data", "always", "initial_only", "when_needed", "never"]
# Properties every Kafka client gets from the settings, not from TRIBUTARY_KAFKA_EXTRA.
_OWN_KAFKA_PROPERTIES = frozenset({"bootstrap.servers", "client.id"})


class SecretValue(Protocol):
    """A password or token (pydantic's ``SecretStr``, or the light settings' own)."""

    def get_secret_value(self) -> str: ...


def empty_is_unset(value: object) -> object:
    """A blank secret is no secret (``TRIBUTARY_API_TOKEN=`` leaves commands open)."""
    if isinstance(value, str) and not value.strip():
        return None
    return value


def _pairs(text: str, example: str) -> dict[str, str]:
    """Comma-separated ``key=value`` items as a dict (blank items skipped); ``example`` says
    what the items are, in the error."""
    pairs: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, equals, setting = item.partition("=")
        if not equals or not key.strip():
            # the item itself is not quoted: it may hold a secret
            raise ValueError(f"each item must be key=value ({example})")
        pairs[key.strip()] = setting.strip()
    return pairs


def key_values(value: object) -> object:
    """``TRIBUTARY_KAFKA_EXTRA``: comma-separated ``key=value`` librdkafka properties (or a
    mapping, from the TOML file) as a dict of strings; never the client's own properties."""
    if isinstance(value, str):
        value = _pairs(value, "comma-separated librdkafka properties, e.g. socket.timeout.ms=30000")
    if isinstance(value, dict):
        own = sorted(_OWN_KAFKA_PROPERTIES & set(value))
        if own:
            raise ValueError(
                f"{', '.join(own)} cannot be set here: use TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS"
                " (the client id is chosen per client)"
            )
        return {str(k): str(v) for k, v in value.items()}
    return value


# Spark properties with a setting of their own, not from TRIBUTARY_SPARK_CONF.
_OWN_SPARK_PROPERTIES = {
    "spark.master": "TRIBUTARY_SPARK_MASTER",
    "spark.driver.memory": "TRIBUTARY_SPARK_DRIVER_MEMORY",
    "spark.driver.extraJavaOptions": "TRIBUTARY_SPARK_JAVA_OPTIONS",
    "spark.executor.extraJavaOptions": "TRIBUTARY_SPARK_JAVA_OPTIONS",
}
_SECRET_SPARK_PROPERTY = re.compile(r"secret|password|token|credential", re.IGNORECASE)


def spark_properties(value: object) -> object:
    """``TRIBUTARY_SPARK_CONF``: Spark properties as a JSON object
    (``{"spark.executor.memory": "2g"}``: any value, commas included) or comma-separated
    ``key=value`` (``spark.executor.memory=2g,spark.cores.max=2``: values without commas), or
    a table of the TOML file; a dict of strings (``true``/``false`` for booleans). Every key
    is a ``spark.*`` property, and none that a setting of Tributary's sets."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except ValueError:
                raise ValueError(
                    "not a JSON object of Spark properties (nor key=value, comma-separated)"
                ) from None
        else:
            value = _pairs(
                text,
                "comma-separated Spark properties, e.g. spark.executor.memory=2g; a JSON"
                " object for values with commas",
            )
    if not isinstance(value, dict):
        return value  # pydantic says what is wrong with it
    properties: dict[str, str] = {}
    for key, setting in value.items():
        if not isinstance(key, str) or not key.startswith("spark."):
            raise ValueError(f"{key!r} is not a Spark property (spark.*)")
        if key in _OWN_SPARK_PROPERTIES:
            raise ValueError(f"{key} cannot be set here: use {_OWN_SPARK_PROPERTIES[key]}")
        if isinstance(setting, bool):
            properties[key] = "true" if setting else "false"
        elif isinstance(setting, (str, int, float)):
            properties[key] = str(setting)
        else:
            raise ValueError(f"{key}: a Spark property's value is a string, number or boolean")
    return properties


def is_secret_spark_property(name: str) -> bool:
    """Whether a Spark property holds a secret (``spark.authenticate.secret``,
    ``spark.hadoop.fs.s3a.secret.key``, ``spark.ssl.keyPassword``, ...)."""
    return _SECRET_SPARK_PROPERTY.search(name) is not None


def comma_list(value: object) -> object:
    """A comma-separated list (``TRIBUTARY_CDC_TABLES``) as a tuple of its non-blank items."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


class SettingsMethods:
    """The settings' derived endpoints and config objects, and the checks across fields."""

    if TYPE_CHECKING:  # the fields these read (declared with their defaults by the settings)
        home: Path
        postgres_port: int
        broker_port: int
        redis_port: int
        schema_registry_port: int
        kafka_bootstrap_servers: str | None
        postgres_url: str | None
        redis_url: str | None
        schema_registry_url: str | None
        views_read_url: str | None
        cdc_connector_name: str
        cdc_tables: tuple[str, ...]
        cdc_topic_prefix: str
        cdc_snapshot_mode: SnapshotMode
        cdc_heartbeat_ms: int
        cdc_outbox_table: str
        cdc_schema_wait_s: float
        event_topic_prefix: str
        kafka_security_protocol: SecurityProtocol | None
        kafka_sasl_mechanism: SaslMechanism | None
        kafka_sasl_username: str | None
        kafka_sasl_password: SecretValue | None
        kafka_ssl_ca_location: str | None
        kafka_ssl_certificate_location: str | None
        kafka_ssl_key_location: str | None
        kafka_ssl_key_password: SecretValue | None
        kafka_extra: dict[str, str]
        spark_conf: dict[str, str]
        kafka_admin_timeout_s: float
        api_token: SecretValue | None
        api_read_token: SecretValue | None
        api_port: int
        cdc_metrics_port: int
        commands_metrics_port: int
        views_metrics_port: int
        views_standby_metrics_port: int
        spark_class_archive: Path | None
        cdc_class_archive: Path | None

    def check_kafka_security(self) -> None:
        """Register every secret (masked from now on), then check that Kafka's security
        settings go together; :class:`ValueError` names the variables when they do not."""
        register_secret(*self.secret_values())  # first: masked even if a check below fails
        protocol = self.kafka_security_protocol
        sasl = {
            "TRIBUTARY_KAFKA_SASL_MECHANISM": self.kafka_sasl_mechanism,
            "TRIBUTARY_KAFKA_SASL_USERNAME": self.kafka_sasl_username,
            "TRIBUTARY_KAFKA_SASL_PASSWORD": self.kafka_sasl_password,
        }
        ssl = {
            "TRIBUTARY_KAFKA_SSL_CA_LOCATION": self.kafka_ssl_ca_location,
            "TRIBUTARY_KAFKA_SSL_CERTIFICATE_LOCATION": self.kafka_ssl_certificate_location,
            "TRIBUTARY_KAFKA_SSL_KEY_LOCATION": self.kafka_ssl_key_location,
            "TRIBUTARY_KAFKA_SSL_KEY_PASSWORD": self.kafka_ssl_key_password,
        }
        given_sasl = [name for name, value in sasl.items() if value is not None]
        given_ssl = [name for name, value in ssl.items() if value is not None]
        if given_sasl and protocol not in ("SASL_PLAINTEXT", "SASL_SSL"):
            raise ValueError(
                f"{', '.join(given_sasl)} need TRIBUTARY_KAFKA_SECURITY_PROTOCOL=SASL_SSL"
                " (or SASL_PLAINTEXT)"
            )
        if given_ssl and protocol not in ("SSL", "SASL_SSL"):
            raise ValueError(
                f"{', '.join(given_ssl)} need TRIBUTARY_KAFKA_SECURITY_PROTOCOL=SSL or SASL_SSL"
            )
        mechanism_given = self.kafka_sasl_mechanism is not None or bool(
            {"sasl.mechanism", "sasl.mechanisms"} & self.kafka_extra.keys()
        )
        if protocol in ("SASL_PLAINTEXT", "SASL_SSL") and not mechanism_given:
            raise ValueError(
                f"TRIBUTARY_KAFKA_SECURITY_PROTOCOL={protocol} needs"
                " TRIBUTARY_KAFKA_SASL_MECHANISM (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"
            )
        if self.kafka_sasl_mechanism is not None and (
            self.kafka_sasl_username is None or self.kafka_sasl_password is None
        ):
            raise ValueError(
                f"TRIBUTARY_KAFKA_SASL_MECHANISM={self.kafka_sasl_mechanism} needs"
                " TRIBUTARY_KAFKA_SASL_USERNAME and TRIBUTARY_KAFKA_SASL_PASSWORD"
            )
        clash = sorted(self.kafka_extra.keys() & self._typed_kafka_properties().keys())
        if clash:
            raise ValueError(
                f"TRIBUTARY_KAFKA_EXTRA sets {', '.join(clash)}, which a TRIBUTARY_KAFKA_* setting"
                " already sets: keep one"
            )

    def secret_values(self) -> list[str]:
        """Every password and token in the settings (masked wherever Tributary prints)."""
        values = [
            url_password(self.postgres_url),
            url_password(self.views_read_url),
            url_password(self.redis_url),
            url_password(self.schema_registry_url),
            *(
                secret.get_secret_value()
                for secret in (
                    self.api_token,
                    self.api_read_token,
                    self.kafka_sasl_password,
                    self.kafka_ssl_key_password,
                )
                if secret is not None
            ),
            *(value for key, value in self.kafka_extra.items() if is_secret_property(key)),
            *(value for key, value in self.spark_conf.items() if is_secret_spark_property(key)),
        ]
        return [v for v in values if v]

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

    @property
    def registry_url(self) -> str:
        """Where the schema registry answers (the local one unless
        TRIBUTARY_SCHEMA_REGISTRY_URL)."""
        local = f"http://127.0.0.1:{self.schema_registry_port}"
        return (self.schema_registry_url or local).rstrip("/")

    @property
    def cdc_class_archive_path(self) -> Path:
        """The CDC engine's class-data archive (the setting, else beside the packages)."""
        from cdc.class_archive import default_archive

        return self.cdc_class_archive or default_archive()

    @property
    def spark_class_archive_path(self) -> Path:
        """The Spark drivers' class-data archive (the setting, else beside the packages)."""
        from spark_streaming.class_archive import default_archive

        return self.spark_class_archive or default_archive()

    @property
    def views_read_database_url(self) -> str:
        """Where the serving side reads the views' tables (the read-only role's URL)."""
        return self.views_read_url or self.database_url

    def _typed_kafka_properties(self) -> dict[str, str]:
        secret = {
            "sasl.password": self.kafka_sasl_password,
            "ssl.key.password": self.kafka_ssl_key_password,
        }
        plain = {
            "security.protocol": self.kafka_security_protocol,
            "sasl.mechanism": self.kafka_sasl_mechanism,
            "sasl.username": self.kafka_sasl_username,
            "ssl.ca.location": self.kafka_ssl_ca_location,
            "ssl.certificate.location": self.kafka_ssl_certificate_location,
            "ssl.key.location": self.kafka_ssl_key_location,
        }
        props = {k: v for k, v in plain.items() if v is not None}
        props.update({k: v.get_secret_value() for k, v in secret.items() if v is not None})
        return props

    def kafka_properties(self) -> dict[str, str]:
        """The librdkafka properties (security and TRIBUTARY_KAFKA_EXTRA) every client gets."""
        return {**self._typed_kafka_properties(), **self.kafka_extra}

    def kafka_security_env(self) -> dict[str, str]:
        """Kafka's security settings (and TRIBUTARY_KAFKA_EXTRA) as the ``TRIBUTARY_*``
        variables that give a child process the same ones (the local stack's registry)."""
        fields = {
            "TRIBUTARY_KAFKA_SECURITY_PROTOCOL": self.kafka_security_protocol,
            "TRIBUTARY_KAFKA_SASL_MECHANISM": self.kafka_sasl_mechanism,
            "TRIBUTARY_KAFKA_SASL_USERNAME": self.kafka_sasl_username,
            "TRIBUTARY_KAFKA_SASL_PASSWORD": self.kafka_sasl_password,
            "TRIBUTARY_KAFKA_SSL_CA_LOCATION": self.kafka_ssl_ca_location,
            "TRIBUTARY_KAFKA_SSL_CERTIFICATE_LOCATION": self.kafka_ssl_certificate_location,
            "TRIBUTARY_KAFKA_SSL_KEY_LOCATION": self.kafka_ssl_key_location,
            "TRIBUTARY_KAFKA_SSL_KEY_PASSWORD": self.kafka_ssl_key_password,
        }
        env = {
            name: value if isinstance(value, str) else value.get_secret_value()
            for name, value in fields.items()
            if value is not None
        }
        if self.kafka_extra:
            env["TRIBUTARY_KAFKA_EXTRA"] = ",".join(f"{k}={v}" for k, v in self.kafka_extra.items())
        return env

    def kafka(self, client_id: str = "tributary") -> KafkaConfig:
        return KafkaConfig(
            bootstrap_servers=self.bootstrap_servers,
            client_id=client_id,
            extra=self.kafka_properties(),
            admin_timeout_s=self.kafka_admin_timeout_s,
        )

    def postgres(self) -> PostgresConfig:
        return PostgresConfig(url=self.database_url)

    def views_read_postgres(self) -> PostgresConfig:
        """The read-only role's PostgreSQL (the main one unless TRIBUTARY_VIEWS_READ_URL)."""
        return PostgresConfig(url=self.views_read_database_url)

    def metrics_port(self, part: str) -> int:
        """The metrics port of a long-running part (``cdc``, ``commands``, ``views``,
        ``views-standby``; ``api`` serves them on its own port)."""
        ports = {
            "cdc": self.cdc_metrics_port,
            "commands": self.commands_metrics_port,
            "views": self.views_metrics_port,
            "views-standby": self.views_standby_metrics_port,
            "api": self.api_port,
        }
        return ports.get(part, 0)

    @property
    def cdc_state_dir(self) -> Path:
        return self.home / "cdc"

    @property
    def verify_state_dir(self) -> Path:
        """What `verify` read of each topic (its checkpoints)."""
        return self.home / "verify"

    def debezium(self) -> "DebeziumPostgresConfig":
        from connectors.debezium import DebeziumPostgresConfig

        return DebeziumPostgresConfig(
            name=self.cdc_connector_name,
            database=self.postgres(),
            tables=self.cdc_tables,
            topic_prefix=self.cdc_topic_prefix,
            snapshot_mode=self.cdc_snapshot_mode,
            heartbeat_interval_ms=self.cdc_heartbeat_ms,
            outbox_table=self.cdc_outbox_table or None,
            event_topic_prefix=self.event_topic_prefix,
            schema_wait_s=self.cdc_schema_wait_s,
            schema_registry_url=self.registry_url,
            offsets_file=(self.cdc_state_dir / f"{self.cdc_connector_name}.offsets").resolve(),
        )
