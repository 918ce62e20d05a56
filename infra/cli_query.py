"""CLI: ``tributary query NAME [ARGS...] [--PARAM VALUE ...]`` runs a view's declared query.

The same queries ``tributary serve`` offers over HTTP, found by name among the configured views:
positional ARGS fill the query's required parameters in declaration order, ``--param value``
any parameter. The result is printed as JSON. Exit codes: 0 answered; 1 unknown query, nothing
found, or a store that cannot be reached; 2 bad arguments; 3 views lagging behind
``--min-position``.
"""

import json
import sys
from typing import Annotated, NoReturn

import typer
from rich.markup import escape

from infra.cli_app import app, err_console, settings
from tributary.errors import TributaryError
from tributary.redact import redact

EXIT_BAD_ARGUMENTS = 2
EXIT_LAGGING = 3


def _exit(code: int, reason: str) -> NoReturn:
    err_console.print(
        f"[bold red]error:[/] {escape(redact(reason))}", highlight=False, soft_wrap=True
    )
    raise typer.Exit(code=code)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    epilog="Example: tributary query timeline 42 --limit 5",
)
def query(
    ctx: typer.Context,
    name: Annotated[
        str,
        typer.Argument(
            metavar="NAME [ARGS]...", help="The query's name (e.g. search), then its arguments."
        ),
    ],
    min_position: Annotated[
        str | None,
        typer.Option(
            "--min-position",
            help="A position token (from a command's result): answer once the views applied it.",
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0, help="Seconds to wait for --min-position.")
    ] = 10.0,
) -> None:
    """Run a view query: ARGS fill its required parameters in order, --PARAM VALUE the rest;
    prints the result as JSON."""
    from infra import view_queries
    from infra.views import views_config
    from views.catalog import configured_views

    s = settings(light=True)
    try:
        views = list(configured_views(views_config(s)).values())
        entry = view_queries.find_query(view_queries.declared_queries(views), name)
    except TributaryError as exc:
        _exit(1, str(exc))
    try:
        arguments = view_queries.cli_arguments(entry, ctx.args)
    except TributaryError as exc:
        _exit(EXIT_BAD_ARGUMENTS, str(exc))
    waiter = view_queries.LazyWaiter(lambda: view_queries.default_waiter(views, s))
    try:
        result = view_queries.run_query(entry, arguments, waiter, min_position, timeout)
    except Exception as exc:
        failure = view_queries.failure_of(exc)
        if failure is None:
            raise
        if failure.kind == "lagging":
            _exit(EXIT_LAGGING, f"{failure.reason} (lagging: {', '.join(failure.lagging)})")
        if failure.kind == "invalid":
            _exit(EXIT_BAD_ARGUMENTS, failure.reason)
        if failure.kind == "not_found":
            _exit(1, f"not found: {failure.reason}")
        _exit(1, f"unavailable: {failure.reason}")
    sys.stdout.write(json.dumps(json_ready(result)) + "\n")


_JSON_LEAVES = (str, int, float, bool, type(None))


def _plain(value: object) -> bool:
    """Only JSON's own types (exactly: not a subclass such as an enum's), all the way down."""
    if type(value) in _JSON_LEAVES:
        return True
    if type(value) in (list, tuple) and isinstance(value, (list, tuple)):
        return all(_plain(item) for item in value)
    if type(value) is dict and isinstance(value, dict):
        return all(type(k) is str and _plain(v) for k, v in value.items())
    return False


def json_ready(result: object) -> object:
    """``result`` as the HTTP API encodes it (FastAPI's ``jsonable_encoder``: dates as ISO
    text, models and dataclasses as objects, ...). Plain JSON values (what the stores answer,
    most often) are returned as they are, which is what the encoder returns for them: the web
    framework's import (~0.2 s) is paid only for the other values."""
    if _plain(result):
        return result
    from fastapi.encoders import jsonable_encoder

    return jsonable_encoder(result)
