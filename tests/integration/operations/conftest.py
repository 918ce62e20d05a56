"""Fixtures of the operators' tests: the session's SparkSession, a per-test views schema and
change feed (as the Spark tests have them), and the CLI pointed at the session's stack."""

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from tests.integration.cli_process import run_tributary
from tests.integration.conftest import Endpoints
from tests.integration.spark_streaming.conftest import (  # noqa: F401  (the session's)
    feed,
    session_spark,
    spark,
    views_schema,
)


def cli_env(stack: Endpoints, home: Path, schema: str, **extra: str) -> dict[str, str]:
    """The CLI on the session's services, with its own home and views schema."""
    env = {
        **os.environ,
        "TRIBUTARY_HOME": str(home),
        "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        **stack.settings.kafka_security_env(),  # SASL/TLS of a brought Kafka
        "TRIBUTARY_SCHEMA_REGISTRY_URL": stack.settings.registry_url,
        "TRIBUTARY_POSTGRES_URL": stack.database_url,
        "TRIBUTARY_REDIS_URL": stack.redis_url,
        "TRIBUTARY_VIEWS_SCHEMA": schema,
        "TRIBUTARY_VIEW_CHECKPOINT_DIR": str(home / "checkpoints"),
        "TRIBUTARY_MIRROR_TABLES": "",
        "TRIBUTARY_VIEWS": "",
        "TRIBUTARY_ANALYTICS": "",
        "COLUMNS": "200",
    }
    env.update(extra)
    return env


def cli(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``tributary ARGS`` as a process."""
    done = run_tributary(env, *args)
    if check:
        assert done.returncode == 0, f"tributary {' '.join(args)}: {done.stderr[-3000:]}"
    return done


def cli_json(env: dict[str, str], *args: str) -> Any:
    return json.loads(cli(env, *args).stdout)
