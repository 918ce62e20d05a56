"""The commands that read the views and send commands, run against a stack, import neither
Spark, Arrow nor numpy (issue 24: a CLI that answers at once; only the commands that fold,
write a batch or run Spark pay for them). tests/unit/infra/test_cli_imports.py pins what they
import before they reach a service; this runs them through the stores' and the broker's
answers."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import Endpoints

#: Spark, the JVM bridge and the columnar libraries: for `run views`, `replay` and the folds.
NEVER = ["pyspark", "py4j", "pyarrow", "numpy", "examples.social.views.folds"]

RUN = """
import json, sys
sys.argv = ["tributary", *json.loads(sys.argv[1])]
from infra.cli import main
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code or 0
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""

POST = '{"post_id": 424242, "author_id": 1, "text": "imports"}'


def run(args: list[str], env: dict[str, str]) -> tuple[int, set[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    last = json.loads(done.stderr.strip().splitlines()[-1])
    return last["code"], set(last["modules"]), done.stdout + done.stderr


def loaded(modules: set[str], names: list[str]) -> list[str]:
    return [n for n in names if n in modules or any(m.startswith(n + ".") for m in modules)]


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["status", "--json"],
        ["views", "--json"],
        ["query", "timeline", "42"],
        ["command", "CreatePost", "--data", POST],
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_the_fast_commands_import_no_spark_nor_arrow_against_a_stack(
    args: list[str], stack: Endpoints, tmp_path: Path, unique: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIBUTARY_")}
    env |= {
        "TRIBUTARY_HOME": str(tmp_path / "state"),
        "TRIBUTARY_CONFIG_FILE": str(tmp_path / "absent.toml"),
        "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        **stack.settings.kafka_security_env(),  # SASL/TLS of a brought Kafka
        "TRIBUTARY_POSTGRES_URL": stack.database_url,
        "TRIBUTARY_REDIS_URL": stack.redis_url,
        # no processor reads it: the command is only sent
        "TRIBUTARY_COMMANDS_TOPIC": f"commands-imports-{unique}",
    }
    code, modules, output = run(args, env)
    assert code == 0, output
    if args[0] in ("status", "views"):
        assert "connectors.stores.redis" in modules and "psycopg" in modules  # read the stores
    if args[0] == "query":
        assert output.startswith("[") or output.startswith("{"), output
        assert "redis" not in modules  # the timeline's store is PostgreSQL
    assert loaded(modules, NEVER) == [], output
