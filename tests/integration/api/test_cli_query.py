"""``tributary query`` in a child process over the test's views (``TRIBUTARY_VIEWS``): the
answers, and the exit codes of unknown queries (1), bad arguments (2), stores that cannot be
reached (1) and views lagging behind ``--min-position`` (3). The reasons of bad arguments are
checked on the same CLI in this process (one child process proves the exit code): a child
process costs a second or more of start, three to four on the suite's busy cores."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from projections.view import View
from tests.integration.conftest import Endpoints

ROOT = Path(__file__).resolve().parents[3]


def query_env(stack: Endpoints, views_schema: str, tmp: Path, **overrides: str) -> dict[str, str]:
    return {
        **os.environ,
        "TRIBUTARY_HOME": str(tmp / "home"),
        "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        **stack.settings.kafka_security_env(),  # SASL/TLS of a brought Kafka
        "TRIBUTARY_SCHEMA_REGISTRY_URL": stack.settings.registry_url,
        "TRIBUTARY_POSTGRES_URL": stack.database_url,
        "TRIBUTARY_REDIS_URL": stack.redis_url,
        "TRIBUTARY_MIRROR_TABLES": "",
        "TRIBUTARY_VIEWS": "tests.integration.api.library:views",
        "TRIBUTARY_VIEWS_SCHEMA": views_schema,
        **overrides,
    }


def query(env: dict[str, str], *args: str, module: str = "infra.cli") -> tuple[int, str, str]:
    """Exit code, stdout, and stderr with rich's line wrapping undone."""
    done = subprocess.run(
        [sys.executable, "-m", module, "query", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout, " ".join(done.stderr.split())


def query_here(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """:func:`query` on the same Typer application in this process, run as the CLI runs it (as
    a group of commands), with ``env`` set while it runs."""
    import typer
    from click.testing import CliRunner

    from infra import cli_query  # noqa: F401  (registers `query`)
    from infra.cli_app import app

    done = CliRunner().invoke(typer.main.get_group(app), ["query", *args], env=env)
    return done.exit_code, done.stdout, " ".join(done.stderr.split())


@pytest.fixture
def cli_env(
    stack: Endpoints, api_views: list[View], views_schema: str, tmp_path: Path
) -> dict[str, str]:
    return query_env(stack, views_schema, tmp_path)


def test_query_prints_the_json_result(cli_env: dict[str, str]) -> None:
    code, out, err = query(cli_env, "note", "1")
    assert code == 0, err
    assert json.loads(out) == {"id": 1, "text": "first", "tags": ["a"]}
    code, out, err = query(cli_env, "notes", "a", "--limit", "1")
    assert code == 0 and [n["id"] for n in json.loads(out)] == [2], err
    code, out, err = query(cli_env, "notes", "--tag=b")
    assert code == 0 and [n["id"] for n in json.loads(out)] == [3, 2], err
    code, out, err = query(cli_env, "counter", "visits")
    assert code == 0 and json.loads(out) == {"name": "visits", "value": 7}, err


def test_an_unknown_query_exits_1_listing_the_available_ones(cli_env: dict[str, str]) -> None:
    code, out, err = query(cli_env, "nope")
    assert code == 1 and out == ""
    assert "no view query called 'nope'; available: counter, note, notes" in err


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (("note", "abc"), "note_id: expected an integer, got 'abc'"),
        (("note", "0"), "note_id: must be at least 1"),
        (("note",), "missing NOTE_ID; usage: tributary query note NOTE_ID"),
        (("note", "1", "2"), "unexpected argument(s) '2'"),
        (("notes", "a", "--limit", "0"), "limit: must be at least 1, got 0"),
        (("notes", "a", "--limit", "51"), "limit: must be at most 50, got 51"),
        (("notes", "a", "--limit"), "--limit needs a value"),
        (
            ("notes", "a", "--bogus", "1"),
            "query notes has no parameter --bogus; usage: tributary query notes TAG [--limit INT]",
        ),
        (("notes", "two words"), "tag must be one word"),
    ],
)
def test_bad_arguments_exit_2_with_the_reason(
    cli_env: dict[str, str], args: tuple[str, ...], reason: str
) -> None:
    code, out, err = query_here(cli_env, *args)
    assert code == 2 and out == "", err
    assert reason in err


def test_bad_arguments_exit_2_from_a_child_process(cli_env: dict[str, str]) -> None:
    code, out, err = query(cli_env, "notes", "a", "--limit", "51")
    assert code == 2 and out == "", err
    assert "limit: must be at most 50, got 51" in err


def test_nothing_found_exits_1(cli_env: dict[str, str]) -> None:
    code, out, err = query(cli_env, "note", "99")
    assert code == 1 and out == "" and "not found: no note 99" in err


def test_a_store_that_cannot_be_reached_exits_1_with_the_reason(
    stack: Endpoints, api_views: list[View], views_schema: str, tmp_path: Path, closed_port: int
) -> None:
    env = query_env(
        stack, views_schema, tmp_path, TRIBUTARY_REDIS_URL=f"redis://127.0.0.1:{closed_port}/0"
    )
    code, out, err = query(env, "counter", "visits")
    assert code == 1 and out == "", err
    assert "unavailable:" in err and "Redis unreachable" in err
    assert "Traceback" not in err


def test_views_lagging_behind_min_position_exit_3_naming_them(cli_env: dict[str, str]) -> None:
    driver = "tests.integration.api.query_driver"
    code, out, err = query(cli_env, "note", "1", "--min-position", "notes@0", module=driver)
    assert code == 0 and json.loads(out)["id"] == 1, err
    code, out, err = query(
        cli_env, "note", "1", "--min-position", "notes@5", "--timeout", "0.3", module=driver
    )
    assert code == 3 and out == "", err
    assert "did not apply notes@5" in err and "(lagging: notes)" in err
    code, out, err = query(cli_env, "note", "1", "--min-position", "junk", module=driver)
    assert code == 2 and "not a position token" in err
    code, out, err = query(cli_env, "note", "1", "--min-position", "junk")  # ViewWaiter's
    assert code == 2 and "not a position token" in err
