"""Build settings for a test stack in its own folder on its own free ports."""

import os
import tempfile
from pathlib import Path

from infra.settings import Settings, load_settings
from tests.ports import free_port_block

STACK_PORTS = 12  # postgres, redis, broker, s3, 7 internal object-store ports, registry


def isolated_settings(prefix: str = "tributary-test-", **overrides: object) -> Settings:
    """Settings for a fresh stack: a new state folder and a block of free ports."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    # PostgreSQL runs as the `postgres` OS user when tests run as root: it must reach the folder.
    os.chmod(home, 0o755)
    base = free_port_block(STACK_PORTS)
    values: dict[str, object] = {
        "home": home / "state",
        "postgres_port": base,
        "redis_port": base + 1,
        "broker_port": base + 2,
        "objectstore_port": base + 3,
        "objectstore_internal_port": base + 4,
        "schema_registry_port": base + 11,
        "kafka_bootstrap_servers": None,
        "postgres_url": None,
        "redis_url": None,
        "schema_registry_url": None,
    }
    values.update(overrides)
    return load_settings(**values)


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes the CLI use these settings."""
    return {
        **os.environ,
        "TRIBUTARY_HOME": str(settings.home),
        "TRIBUTARY_POSTGRES_PORT": str(settings.postgres_port),
        "TRIBUTARY_REDIS_PORT": str(settings.redis_port),
        "TRIBUTARY_BROKER_PORT": str(settings.broker_port),
        "TRIBUTARY_OBJECTSTORE_PORT": str(settings.objectstore_port),
        "TRIBUTARY_OBJECTSTORE_INTERNAL_PORT": str(settings.objectstore_internal_port),
        "TRIBUTARY_SCHEMA_REGISTRY_PORT": str(settings.schema_registry_port),
    }
