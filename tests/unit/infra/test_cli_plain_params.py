"""The CLI's commands coerce plain ``str``/``int``/``float`` parameters without pydantic when
the value needs nothing (:class:`infra.cli_app._PlainParam`); every value gives what typer's
own coercion gives: the same value and type, the same error."""

from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from infra.cli_app import FastTyper


def _define(app: typer.Typer) -> None:
    @app.command()
    def first(
        name: Annotated[str, typer.Argument()],
        timeout: Annotated[float, typer.Option(min=0)] = 10.0,
        limit: Annotated[int, typer.Option()] = 5,
        ratio: Annotated[float, typer.Option(max=1.0)] = 0.5,
        tag: Annotated[str | None, typer.Option()] = None,
    ) -> None:
        print(repr((name, timeout, limit, ratio, tag)))

    @app.command()
    def second() -> None:  # two commands: a group, as the CLI runs
        pass


def _run(app: typer.Typer, args: list[str]) -> tuple[int, str]:
    done = CliRunner().invoke(app, args)
    return done.exit_code, done.output


CASES = [
    ["first", "x"],
    ["first", " spaced "],
    ["first", "x", "--timeout", "5"],
    ["first", "x", "--timeout", "0"],
    ["first", "x", "--timeout", "-1"],
    ["first", "x", "--timeout", "abc"],
    ["first", "x", "--timeout", "nan"],
    ["first", "x", "--limit", "7"],
    ["first", "x", "--limit", "7.5"],
    ["first", "x", "--limit", "seven"],
    ["first", "x", "--ratio", "2"],
    ["first", "x", "--tag", "t"],
    ["first", "x", "--tag", ""],
    ["first"],
]


@pytest.mark.parametrize("args", CASES)
def test_same_values_and_errors_as_typer(args: list[str]) -> None:
    plain, fast = typer.Typer(), FastTyper()
    _define(plain)
    _define(fast)
    assert _run(fast, args) == _run(plain, args)


def test_a_plain_value_needs_no_adapter() -> None:
    fast = FastTyper()
    _define(fast)
    command = typer.main.get_group(fast).commands["first"]
    params = {p.name: p for p in command.params}
    code, output = _run(fast, ["first", "x"])
    assert (code, output) == (0, "('x', 10.0, 5, 0.5, None)\n")
    from infra.cli_app import _PlainParam

    for name in ("name", "timeout", "limit", "ratio", "tag"):
        assert isinstance(params[name]._runtime_param, _PlainParam), name  # type: ignore[attr-defined]
