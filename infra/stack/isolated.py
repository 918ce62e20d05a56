"""A stack of its own: settings for a fresh local stack in a new state folder on a block of
free ports, and the environment that points the CLI at it (what tests, benchmarks and the
chaos harness start beside any other stack on the machine)."""

import os
import random
import tempfile
from pathlib import Path

from infra.settings import Settings, load_settings
from infra.stack.process import port_is_free

__all__ = ["STACK_PORTS", "free_port_block", "isolated_settings", "settings_env"]

# postgres, redis, broker, s3, 7 internal object-store ports, registry; the parts' metrics;
# a Spark master, its UI and up to 4 workers (master + 10 + index)
STACK_PORTS = 30


def free_port_block(size: int, low: int = 20000, high: int = 32768) -> int:
    """The first port of ``size`` consecutive free ports on 127.0.0.1, below Linux's range of
    ephemeral ports (32768-60999): a port found free there can be given to some outgoing
    connection before the service binds it (seen: SeaweedFS's S3 port, "address already in
    use")."""
    rng = random.Random()
    for _ in range(500):
        base = rng.randrange(low, high - size)
        if all(port_is_free(base + i) for i in range(size)):
            return base
    raise RuntimeError(f"no {size} consecutive free ports between {low} and {high}")


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
        "cdc_metrics_port": base + 12,
        "commands_metrics_port": base + 13,
        "views_metrics_port": base + 14,
        "views_standby_metrics_port": base + 15,
        "spark_master_port": base + 16,  # its workers: + 10 + index (up to 4 workers)
        "spark_master_ui_port": base + 17,
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
        "TRIBUTARY_BROKER_STORAGE": settings.broker_storage,
        "TRIBUTARY_OBJECTSTORE_PORT": str(settings.objectstore_port),
        "TRIBUTARY_OBJECTSTORE_INTERNAL_PORT": str(settings.objectstore_internal_port),
        "TRIBUTARY_SCHEMA_REGISTRY_PORT": str(settings.schema_registry_port),
        "TRIBUTARY_CDC_METRICS_PORT": str(settings.cdc_metrics_port),
        "TRIBUTARY_COMMANDS_METRICS_PORT": str(settings.commands_metrics_port),
        "TRIBUTARY_VIEWS_METRICS_PORT": str(settings.views_metrics_port),
        "TRIBUTARY_VIEWS_STANDBY_METRICS_PORT": str(settings.views_standby_metrics_port),
        "TRIBUTARY_SPARK_MASTER_PORT": str(settings.spark_master_port),
        "TRIBUTARY_SPARK_MASTER_UI_PORT": str(settings.spark_master_ui_port),
    }
