"""The light settings (what `tributary status` loads without pydantic) never drift from the
pydantic settings: for each environment below either both load the same values (every field,
every derived endpoint and config object), or the light loader leaves it to pydantic (returns
None), which it must for every environment pydantic rejects: the error the user sees is then
pydantic's own."""

import inspect
import os
from pathlib import Path

import pytest
import typer
from pydantic import SecretStr, ValidationError

from infra.cli_app import settings as cli_settings
from infra.settings import Settings, light_fields, load_settings, settings_problems
from infra.settings_base import SettingsMethods
from infra.settings_light import FIELDS, LightSettings, light_settings

#: Environments both loaders take alike.
SAME = [
    {},
    {"TRIBUTARY_POSTGRES_PORT": "25432", "tributary_redis_port": "1234"},  # any case
    {"TRIBUTARY_HOME": "/tmp/somewhere", "TRIBUTARY_POSTGRES_BIN_DIR": ""},
    {"TRIBUTARY_VIEWS_SHARE_QUERY": "false", "TRIBUTARY_VIEWS_STANDBY": "ON"},
    {"TRIBUTARY_VIEWS_SHARE_QUERY": "0", "TRIBUTARY_VIEWS_STANDBY": "y"},
    {"TRIBUTARY_VIEWS_SHARE_QUERY": "No", "TRIBUTARY_VIEWS_STANDBY": "True"},
    {"TRIBUTARY_CDC_WAL_WARN_RATIO": "2.5", "TRIBUTARY_KAFKA_ADMIN_TIMEOUT_S": "0.5"},
    {"TRIBUTARY_POSTGRES_WAL_BUDGET_MB": "-1", "TRIBUTARY_ALLOWED_LATENESS_S": "0"},
    {"TRIBUTARY_CDC_METRICS_PORT": "0", "TRIBUTARY_VIEWS_METRICS_PORT": "65535"},
    {"TRIBUTARY_VIEW_MAX_OFFSETS_PER_TRIGGER": "10", "TRIBUTARY_INDEX_DIR": "/tmp/ix"},
    {"TRIBUTARY_POSTGRES_PORT": "007"},
    {"TRIBUTARY_POSTGRES_URL": "", "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": "k1:9092,k2:9092"},
    {
        "TRIBUTARY_POSTGRES_URL": "postgresql+psycopg://app:pw-Secret-1@db:5432/t",
        "TRIBUTARY_REDIS_URL": "redis://:pw-Secret-2@cache:6379/1",
        "TRIBUTARY_VIEWS_READ_URL": "postgresql+psycopg://reader:pw-Secret-3@db:5432/t",
        "TRIBUTARY_SCHEMA_REGISTRY_URL": "http://u:pw-Secret-4@registry:8081/",
    },
    {"TRIBUTARY_CDC_TABLES": " a.b, c.d,, ", "TRIBUTARY_CDC_REPLICA_IDENTITY_FULL": ""},
    {"TRIBUTARY_KAFKA_EXTRA": "socket.timeout.ms=30000, a = b ,,sasl.oauthbearer.x=y"},
    {"TRIBUTARY_KAFKA_EXTRA": ""},
    {"TRIBUTARY_API_TOKEN": "   ", "TRIBUTARY_API_READ_TOKEN": "read-token-123"},
    {"TRIBUTARY_BROKER_STORAGE": "memory", "TRIBUTARY_CDC_SNAPSHOT_MODE": "never"},
    {
        "TRIBUTARY_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "TRIBUTARY_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "TRIBUTARY_KAFKA_SASL_USERNAME": "alice",
        "TRIBUTARY_KAFKA_SASL_PASSWORD": "sasl-Secret-5",
        "TRIBUTARY_KAFKA_SSL_CA_LOCATION": "/etc/ca.pem",
        "TRIBUTARY_KAFKA_SSL_KEY_PASSWORD": "key-Secret-6",
    },
    {
        "TRIBUTARY_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "TRIBUTARY_KAFKA_EXTRA": "sasl.mechanisms=OAUTHBEARER",
    },
    {"TRIBUTARY_SPARK_MASTER": "spark://host:7077", "TRIBUTARY_UNKNOWN_THING": "ignored"},
    {"TRIBUTARY_SPARK_CONF": "spark.executor.memory=2g, spark.cores.max = 2,,"},
    {"TRIBUTARY_SPARK_CONF": ' {"spark.archives": "a.tgz#env,b.zip", "spark.x": true}'},
    {"TRIBUTARY_SPARK_CONF": "spark.hadoop.fs.s3a.secret.key=spark-Secret-8"},
    {"TRIBUTARY_SPARK_CONF": ""},
]

#: Environments pydantic takes but the light loader leaves to it (pydantic coerces them).
PYDANTIC_ONLY = [
    {"TRIBUTARY_POSTGRES_PORT": " 5"},
    {"TRIBUTARY_POSTGRES_PORT": "+5"},
    {"TRIBUTARY_POSTGRES_PORT": "5.0"},
    {"TRIBUTARY_POSTGRES_PORT": "1_000"},
    {"TRIBUTARY_CDC_WAL_WARN_RATIO": "1e3"},
    {"TRIBUTARY_CDC_WAL_WARN_RATIO": ".5"},
    {"TRIBUTARY_CDC_WAL_WARN_RATIO": " 2.5"},
]

#: Environments pydantic rejects.
INVALID = [
    {"TRIBUTARY_POSTGRES_PORT": "abc"},
    {"TRIBUTARY_POSTGRES_PORT": ""},
    {"TRIBUTARY_POSTGRES_PORT": "5.5"},
    {"TRIBUTARY_VIEW_MAX_OFFSETS_PER_TRIGGER": ""},
    {"TRIBUTARY_BROKER_STORAGE": "disk"},
    {"TRIBUTARY_BROKER_STORAGE": "MEMORY"},
    {"TRIBUTARY_KAFKA_ADMIN_TIMEOUT_S": "0"},
    {"TRIBUTARY_ALLOWED_LATENESS_S": "-0.5"},
    {"TRIBUTARY_CDC_METRICS_PORT": "65536"},
    {"TRIBUTARY_VIEWS_METRICS_PORT": "-1"},
    {"TRIBUTARY_VIEWS_SHARE_QUERY": "maybe"},
    {"TRIBUTARY_VIEWS_SHARE_QUERY": "TRUE "},
    {"TRIBUTARY_KAFKA_EXTRA": "novalue"},
    {"TRIBUTARY_KAFKA_EXTRA": "bootstrap.servers=x:9092"},
    {"TRIBUTARY_SPARK_CONF": "spark.executor.memory"},
    {"TRIBUTARY_SPARK_CONF": "executor.memory=2g"},
    {"TRIBUTARY_SPARK_CONF": "spark.master=local[4]"},
    {"TRIBUTARY_SPARK_CONF": '{"spark.executor.memory": '},
    {"TRIBUTARY_SPARK_CONF": '["spark.executor.memory"]'},
    {"TRIBUTARY_SPARK_CONF": '{"spark.executor.memory": ["2g"]}'},
    {"TRIBUTARY_KAFKA_SASL_USERNAME": "alice"},
    {
        "TRIBUTARY_KAFKA_SSL_CA_LOCATION": "/etc/ca.pem",
        "TRIBUTARY_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    },
    {"TRIBUTARY_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"},
    {"TRIBUTARY_KAFKA_SECURITY_PROTOCOL": "TLS"},
    {
        "TRIBUTARY_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "TRIBUTARY_KAFKA_SASL_MECHANISM": "PLAIN",
        "TRIBUTARY_KAFKA_SASL_USERNAME": "alice",
    },
    {
        "TRIBUTARY_KAFKA_SECURITY_PROTOCOL": "SSL",
        "TRIBUTARY_KAFKA_EXTRA": "security.protocol=SSL",
    },
]

#: TOML files (with the environment beside them), each with whether the light loader takes it:
#: "same" (both alike), "pydantic" (pydantic only) or "invalid" (pydantic rejects it).
FILES = [
    ('postgres_port = 25432\nhome = "/tmp/t"\nviews_share_query = false\n', {}, "same"),
    ("POSTGRES_PORT = 25432\nCDC_WAL_WARN_RATIO = 1\nkafka_admin_timeout_s = 2.5\n", {}, "same"),
    ('cdc_tables = ["a.b", "c.d"]\ncdc_replica_identity_full = "x.y, z.w"\n', {}, "same"),
    (
        'kafka_extra = { "socket.timeout.ms" = 30000, "a" = "b" }\napi_token = "tok-Secret-7"\n',
        {},
        "same",
    ),
    ("postgres_port = 25432\n", {"TRIBUTARY_POSTGRES_PORT": "35432"}, "same"),  # env first
    ('kafka_extra = { "a" = "b" }\n', {"TRIBUTARY_KAFKA_EXTRA": "c=d"}, "same"),
    ('broker_storage = "memory"\nunknown = 3\n[section]\nx = 1\n', {}, "same"),
    ("postgres_port = 25432.0\n", {}, "pydantic"),
    ('postgres_port = "25432"\n', {}, "pydantic"),
    ("views_share_query = 1\n", {}, "pydantic"),
    ("postgres_port = 25432\nPostgres_Port = 1\n", {}, "pydantic"),
    ("spark_master = 3\n", {}, "invalid"),
    ("cdc_metrics_port = 70000\n", {}, "invalid"),
    ('kafka_extra = "nope"\n', {}, "invalid"),
    ('[spark_conf]\n"spark.cores.max" = 2\n"spark.pyspark.python" = "/env/bin/py"\n', {}, "same"),
    ('spark_conf = { "spark.driver.memory" = "2g" }\n', {}, "invalid"),
    ('broker_storage = "disk"\n', {}, "invalid"),
]


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.upper().startswith("TRIBUTARY_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TRIBUTARY_CONFIG_FILE", str(tmp_path / "tributary.toml"))
    return monkeypatch


def apply(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def comparable(value: object) -> object:
    if isinstance(value, SecretStr) or type(value).__name__ == "LightSecret":
        return ("secret", value.get_secret_value())  # type: ignore[attr-defined]
    return (type(value), value)


def everything(s: SettingsMethods) -> dict[str, object]:
    """Every field, then every derived property and method's result."""
    seen = {name: comparable(getattr(s, name)) for name in Settings.model_fields}
    for name, member in vars(SettingsMethods).items():
        if name.startswith("__") or name == "check_kafka_security":
            continue
        if isinstance(member, property):
            seen[name] = comparable(getattr(s, name))
        elif name == "metrics_port":
            for part in ("cdc", "commands", "views", "views-standby", "api", "other"):
                seen[f"{name}({part})"] = s.metrics_port(part)
        elif inspect.isfunction(member):
            seen[name] = repr(getattr(s, name)())
    return seen


def test_the_light_table_is_the_model_s_fields() -> None:
    """Regenerate FIELDS from `light_fields()` when a setting is added or changed."""
    assert light_fields() == FIELDS


@pytest.mark.parametrize("env", SAME)
def test_both_loaders_read_the_same_settings(
    env: dict[str, str], environment: pytest.MonkeyPatch
) -> None:
    apply(environment, env)
    light = light_settings()
    assert isinstance(light, LightSettings)
    assert everything(light) == everything(load_settings())


@pytest.mark.parametrize("env", PYDANTIC_ONLY)
def test_values_pydantic_coerces_are_left_to_it(
    env: dict[str, str], environment: pytest.MonkeyPatch
) -> None:
    apply(environment, env)
    load_settings()
    assert light_settings() is None


@pytest.mark.parametrize("env", INVALID)
def test_invalid_settings_are_left_to_pydantic(
    env: dict[str, str], environment: pytest.MonkeyPatch
) -> None:
    apply(environment, env)
    with pytest.raises(ValidationError):
        load_settings()
    assert light_settings() is None


@pytest.mark.parametrize(("text", "env", "outcome"), FILES)
def test_the_toml_file_is_read_alike(
    text: str, env: dict[str, str], outcome: str, environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "tributary.toml").write_text(text)
    apply(environment, env)
    light = light_settings()
    if outcome == "invalid":
        with pytest.raises(ValidationError):
            load_settings()
        assert light is None
    elif outcome == "pydantic":
        load_settings()
        assert light is None
    else:
        assert isinstance(light, LightSettings)
        assert everything(light) == everything(load_settings())


def test_a_file_that_is_not_toml_is_left_to_pydantic(
    environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "tributary.toml").write_text("postgres_port = \n")
    assert light_settings() is None


@pytest.mark.parametrize("env", INVALID[:3] + INVALID[-3:])
def test_the_cli_prints_pydantic_s_error_either_way(
    env: dict[str, str], environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    apply(environment, env)
    with pytest.raises(ValidationError) as raised:
        load_settings()
    printed = []
    for light in (False, True):
        with pytest.raises(typer.Exit):
            cli_settings(light=light)
        printed.append(capsys.readouterr().err)
    assert printed[0] == printed[1]
    assert settings_problems(raised.value) in " ".join(printed[1].split())
