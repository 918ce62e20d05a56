"""The settings without pydantic, for the commands that must answer at once (``tributary
status``): pydantic-settings and pydantic cost ~0.25 s of a start.

:func:`light_settings` reads the same sources as :class:`infra.settings.Settings` (``TRIBUTARY_*``
variables in any case, then the TOML file of :func:`infra.settings_file.config_file`, then the
defaults of :data:`FIELDS`) and accepts only what it is sure pydantic accepts alike: plain
numbers, the boolean words, the listed choices, any string. Anything else (a value pydantic
would coerce in some other way, or reject) makes it answer ``None``, and the caller loads the
pydantic settings: their values and their error messages are then pydantic's own. A unit test
compares the two loaders over a range of environments, and :data:`FIELDS` with the model.
"""

import os
import re
from pathlib import Path
from typing import Any

from infra.settings_base import (
    SettingsMethods,
    comma_list,
    empty_is_unset,
    key_values,
    spark_properties,
)
from infra.settings_file import config_file

#: A field: its kind (``str``, ``int``, ``float``, ``bool``, ``path``, ``secret``, ``choice``,
#: ``strings``: comma-separated, ``pairs``: key=value, ``spark``: Spark properties), whether it
#: may be unset, its default, and its bounds (``("ge", 0)``, ...) or choices.
FieldSpec = tuple[str, bool, object, tuple[Any, ...]]

FIELDS: dict[str, FieldSpec] = {
    "home": ("path", False, Path(".tributary"), ()),
    "postgres_port": ("int", False, 15432, ()),
    "broker_port": ("int", False, 19092, ()),
    "redis_port": ("int", False, 16379, ()),
    "objectstore_port": ("int", False, 18333, ()),
    "objectstore_internal_port": ("int", False, 18340, ()),
    "schema_registry_port": ("int", False, 18081, ()),
    "broker_storage": ("choice", False, "s3", ("s3", "memory")),
    "postgres_bin_dir": ("path", False, Path("/usr/lib/postgresql/15/bin"), ()),
    "redis_server_bin": ("str", False, "redis-server", ()),
    "kafka_bootstrap_servers": ("str", True, None, ()),
    "postgres_url": ("str", True, None, ()),
    "redis_url": ("str", True, None, ()),
    "schema_registry_url": ("str", True, None, ()),
    "schema_registry_topic": ("str", False, "_schemas", ()),
    "views_read_url": ("str", True, None, ()),
    "spark_master": ("str", False, "auto", ()),
    "spark_master_port": ("int", False, 17077, ()),
    "spark_master_ui_port": ("int", False, 17080, ()),
    "spark_worker_cores": ("int", False, 1, (("ge", 1),)),
    "spark_worker_memory": ("str", False, "1g", ()),
    "postgres_wal_budget_mb": ("int", False, 2048, ()),
    "cdc_wal_warn_ratio": ("float", False, 0.8, ()),
    "start_timeout_s": ("float", False, 60.0, ()),
    "cdc_connector_name": ("str", False, "tributary", ()),
    "cdc_tables": ("strings", False, ("public.users", "event_store.events"), ()),
    "cdc_topic_prefix": ("str", False, "cdc", ()),
    "cdc_snapshot_mode": (
        "choice",
        False,
        "initial",
        ("initial", "no_data", "always", "initial_only", "when_needed", "never"),
    ),
    "cdc_heartbeat_ms": ("int", False, 10000, ()),
    "cdc_topic_partitions": ("int", False, 1, ()),
    "cdc_outbox_table": ("str", False, "event_store.events", ()),
    "cdc_schema_wait_s": ("float", False, 60.0, ()),
    "event_topic_prefix": ("str", False, "events.", ()),
    "cdc_replica_identity_full": ("strings", False, (), ()),
    "kafka_security_protocol": (
        "choice",
        True,
        None,
        ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"),
    ),
    "kafka_sasl_mechanism": ("choice", True, None, ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")),
    "kafka_sasl_username": ("str", True, None, ()),
    "kafka_sasl_password": ("secret", True, None, ()),
    "kafka_ssl_ca_location": ("str", True, None, ()),
    "kafka_ssl_certificate_location": ("str", True, None, ()),
    "kafka_ssl_key_location": ("str", True, None, ()),
    "kafka_ssl_key_password": ("secret", True, None, ()),
    "kafka_extra": ("pairs", False, {}, ()),
    "kafka_admin_timeout_s": ("float", False, 15.0, (("gt", 0),)),
    "api_token": ("secret", True, None, ()),
    "api_read_token": ("secret", True, None, ()),
    "event_store_schema": ("str", False, "event_store", ()),
    "event_store_snapshot_every": ("int", False, 100, ()),
    "event_store_max_retries": ("int", False, 5, ()),
    "commands_topic": ("str", False, "commands", ()),
    "command_results_topic": ("str", False, "command-results", ()),
    "command_topic_partitions": ("int", False, 4, ()),
    "command_processor_name": ("str", False, "command-processor", ()),
    "command_owner_timeout_s": ("float", False, 10.0, (("gt", 0),)),
    "command_max_poll_interval_s": ("float", False, 300.0, (("gt", 0),)),
    "command_results_linger_ms": ("int", False, 5, (("ge", 0), ("le", 30_000))),
    "command_results_exactly_once": ("bool", False, False, ()),
    "command_handlers": ("str", False, "examples.social:social_registry", ()),
    "cli_plugins": ("str", False, "examples.social.activity_cli:activity_app", ()),
    "demo": ("str", False, "examples.social.demo:run_demo", ()),
    "forget_tables": ("str", False, "user=public.users.id", ()),
    "forget_step_hook": ("str", False, "", ()),
    "mirror_tables": ("str", False, "public.users", ()),
    "views_schema": ("str", False, "views", ()),
    "view_checkpoint_dir": ("path", True, None, ()),
    "view_max_offsets_per_trigger": ("int", True, 50000, ()),
    "view_replay_max_offsets_per_trigger": ("int", True, 500000, ()),
    "view_trigger_interval_s": ("float", False, 1.0, ()),
    "views_share_query": ("bool", False, True, ()),
    "views_standby": ("bool", False, False, ()),
    "views": ("str", False, "examples.social.views:social_views", ()),
    "analytics": ("str", False, "", ()),
    "activity_topic": ("str", False, "activity", ()),
    "analytics_topic_prefix": ("str", False, "analytics.", ()),
    "allowed_lateness_s": ("float", False, 300.0, (("ge", 0),)),
    "lateness_slack_s": ("float", False, 600.0, (("ge", 0),)),
    "verify_interval_s": ("float", False, 300.0, ()),
    "api_host": ("str", False, "127.0.0.1", ()),
    "api_port": ("int", False, 18080, ()),
    "metrics_host": ("str", False, "127.0.0.1", ()),
    "cdc_metrics_port": ("int", False, 18091, (("ge", 0), ("le", 65535))),
    "commands_metrics_port": ("int", False, 18092, (("ge", 0), ("le", 65535))),
    "views_metrics_port": ("int", False, 18093, (("ge", 0), ("le", 65535))),
    "views_standby_metrics_port": ("int", False, 18094, (("ge", 0), ("le", 65535))),
    "index_dir": ("path", True, None, ()),
    "spark_driver_memory": ("str", False, "1g", ()),
    "spark_java_options": ("str", False, "", ()),
    "spark_conf": ("spark", False, {}, ()),
    "cdc_java_options": ("str", False, "", ()),
    "cdc_publisher": ("choice", False, "jvm", ("jvm", "python")),
    "spark_class_archive": ("path", True, None, ()),
    "cdc_class_archive": ("path", True, None, ()),
}

_INT = re.compile(r"-?[0-9]{1,18}", re.ASCII)
_FLOAT = re.compile(r"-?[0-9]{1,18}(\.[0-9]{1,18})?", re.ASCII)
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


class _Unsure(Exception):
    """A value the light loader leaves to pydantic."""


class LightSecret:
    """A password or token, shown as pydantic's ``SecretStr`` shows one."""

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LightSecret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __str__(self) -> str:
        return "**********" if self._value else ""

    def __repr__(self) -> str:
        return f"SecretStr('{self}')"


class LightSettings(SettingsMethods):
    """The settings' values as attributes, frozen, with the derived endpoints and config
    objects of :class:`infra.settings_base.SettingsMethods`."""

    def __init__(self, values: dict[str, object]) -> None:
        self.__dict__.update(values)

    def __setattr__(self, name: str, value: object) -> None:
        raise TypeError(f"settings are frozen: cannot set {name}")


def _from_env(kind: str, text: str, extra: tuple[Any, ...]) -> object:
    if kind == "int" and _INT.fullmatch(text):
        return int(text)
    if kind == "float" and _FLOAT.fullmatch(text):
        return float(text)
    if kind == "bool" and text.lower() in _TRUE | _FALSE:
        return text.lower() in _TRUE
    if kind in ("str", "choice", "path", "secret", "strings", "pairs", "spark"):
        return _from_file(kind, text, extra)
    raise _Unsure


def _from_file(kind: str, value: object, extra: tuple[Any, ...]) -> object:
    """A value of the TOML file (or a variable's text): only the types pydantic takes as they
    are."""
    if kind == "str" and isinstance(value, str):
        return value
    if kind == "choice" and isinstance(value, str) and value in extra:
        return value
    if kind == "path" and isinstance(value, str):
        return Path(value)
    if kind == "secret" and isinstance(value, str):
        unset = empty_is_unset(value)
        return None if unset is None else LightSecret(value)
    if kind == "strings":
        items = comma_list(value)
        if isinstance(items, (list, tuple)) and all(isinstance(i, str) for i in items):
            return tuple(items)
    if kind == "pairs" and isinstance(value, (str, dict)):
        try:
            return key_values(value)
        except ValueError:
            raise _Unsure from None
    if kind == "spark" and isinstance(value, (str, dict)):
        try:
            return spark_properties(value)
        except ValueError:
            raise _Unsure from None
    if type(value) is int and kind in ("int", "float"):
        return value if kind == "int" else float(value)
    if type(value) is float and kind == "float" and value == value and abs(value) != float("inf"):
        return value
    if type(value) is bool and kind == "bool":
        return value
    raise _Unsure


def _in_bounds(value: object, bounds: tuple[Any, ...]) -> bool:
    if not isinstance(value, (int, float)):
        return True
    for op, limit in bounds:
        if (op == "gt" and not value > limit) or (op == "ge" and not value >= limit):
            return False
        if op == "le" and not value <= limit:
            return False
    return True


def light_values(environ: dict[str, str] | None = None) -> dict[str, object] | None:
    """Each field's value from the environment, the TOML file or its default; ``None`` when a
    value is one to leave to pydantic (or the file cannot be read as TOML)."""
    env = {k.lower(): v for k, v in (os.environ if environ is None else environ).items()}
    path = config_file()
    file: dict[str, object] = {}
    if path.is_file():
        import tomllib

        try:
            with path.open("rb") as f:
                loaded = tomllib.load(f)
        except (OSError, ValueError):
            return None
        for key, value in loaded.items():
            if key.lower() in file:
                return None  # two keys for one field
            file[key.lower()] = value
    values: dict[str, object] = {}
    try:
        for name, (kind, _, default, extra) in FIELDS.items():
            variable = f"tributary_{name}"
            if variable in env:
                value = _from_env(kind, env[variable], extra)
            elif name in file:
                value = _from_file(kind, file[name], extra)
            else:
                value = dict(default) if isinstance(default, dict) else default
            if not _in_bounds(value, extra if kind != "choice" else ()):
                return None
            values[name] = value
    except _Unsure:
        return None
    return values


def light_settings() -> LightSettings | None:
    """The settings, or ``None`` when pydantic must load them (see the module's doc)."""
    values = light_values()
    if values is None:
        return None
    settings = LightSettings(values)
    try:
        settings.check_kafka_security()
    except ValueError:
        return None
    return settings
