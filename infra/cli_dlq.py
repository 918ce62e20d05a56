"""CLI: a view's dead letters (`dlq list VIEW`, `dlq show VIEW ID`, `dlq redrive VIEW`).

``redrive`` re-feeds dead letters to the view after a fix (an upcaster added, a column
widened), each at most once: see :mod:`views.redrive`.
"""

import json
import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from infra.cli_app import FastTyper, JsonFlag, app, console, fail, settings
from tributary.errors import TributaryError
from tributary.redact import redact_data

if TYPE_CHECKING:
    from infra.settings import Settings
    from views.redrive import DeadLetterRecord, RedriveLedger

dlq_app = FastTyper(
    name="dlq",
    help="A view's dead letters: list, show, and redrive them after a fix.",
    no_args_is_help=True,
)
app.add_typer(dlq_app)

ViewArg = Annotated[str, typer.Argument(help="The view, e.g. mirror.public.users or timeline.")]


def _view_name(s: "Settings", view: str) -> str:
    """The configured view's full name (``schema.table`` finds its mirror)."""
    from infra.views import views_config
    from views.catalog import find_view

    return find_view(views_config(s), view).name


def _ledger(s: "Settings") -> "RedriveLedger":
    from views.redrive import RedriveLedger

    return RedriveLedger(s.postgres().dsn, s.views_schema)


def _letters(s: "Settings", view: str) -> list["DeadLetterRecord"]:
    from views.redrive import dead_letters

    return dead_letters(s.kafka("tributary-cli"), view)


def _redriven(s: "Settings", view: str) -> dict[str, str]:
    """Id -> outcome of the view's dead letters in the redrive ledger ({} when none yet)."""
    import psycopg

    ledger = _ledger(s)
    try:
        with psycopg.connect(ledger.dsn, autocommit=True, connect_timeout=10) as conn:
            return ledger.done(conn, view)
    except psycopg.errors.UndefinedTable:
        return {}


def _when(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


@dlq_app.command("list")
def list_command(view: ViewArg, as_json: JsonFlag = False) -> None:
    """The view's dead letters: id, when, stage, reason, source record, redrive state."""
    from rich.table import Table

    s = settings()
    try:
        name = _view_name(s, view)
        letters = _letters(s, name)
        redriven = _redriven(s, name)
    except TributaryError as exc:
        fail(exc)
    rows = [{**d.as_dict(), "redrive": redriven.get(d.id)} for d in letters]
    if as_json:
        sys.stdout.write(json.dumps(redact_data(rows)) + "\n")
        return
    table = Table("id", "dead-lettered", "stage", "reason", "source", "key", "redrive")
    for d, row in zip(letters, rows, strict=True):
        table.add_row(
            d.id,
            _when(d.at),
            d.stage,
            escape(d.reason),
            escape(row["source"]),
            escape(str(row["key"])[:40]),
            row["redrive"] or "-",
        )
    console.print(table)
    console.print(f"{len(letters)} dead letters on dlq.{name}")


@dlq_app.command("show")
def show_command(
    view: ViewArg,
    letter_id: Annotated[str, typer.Argument(metavar="ID", help="PARTITION:OFFSET, or OFFSET.")],
) -> None:
    """One dead letter in full (key, value, headers' reason and source) as JSON."""
    from views.redrive import parse_id

    s = settings()
    try:
        name = _view_name(s, view)
        wanted = parse_id(letter_id)
        found = [d for d in _letters(s, name) if d.id == wanted]
        redriven = _redriven(s, name)
    except TributaryError as exc:
        fail(exc)
    if not found:
        fail(f"no dead letter {wanted} on dlq.{name} (`tributary dlq list {name}` shows them)")
    out: dict[str, Any] = {**found[0].as_dict(full=True), "redrive": redriven.get(wanted)}
    sys.stdout.write(json.dumps(redact_data(out), indent=2) + "\n")


@dlq_app.command("redrive")
def redrive_command(
    view: ViewArg,
    since: Annotated[
        str | None,
        typer.Option(help="Only dead letters since then: 15m, 2h, 1d or an ISO-8601 time."),
    ] = None,
    ids: Annotated[
        str | None, typer.Option(help="Only these dead letters (comma-separated ids).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Re-feed dead letters to the view (after a fix): each is appended back to its source
    partition once; one redriven before is never sent again."""
    from views.redrive import redrive, select_letters, since_seconds

    s = settings()
    try:
        name = _view_name(s, view)
        chosen = select_letters(
            _letters(s, name),
            since=None if since is None else since_seconds(since),
            ids=None if ids is None else [i for i in ids.split(",") if i.strip()],
        )
        outcomes = redrive(s.kafka("tributary-cli"), _ledger(s), name, chosen)
    except TributaryError as exc:
        fail(exc)
    if as_json:
        sys.stdout.write(json.dumps([o.as_dict() for o in outcomes]) + "\n")
        return
    for o in outcomes:
        console.print(
            f"{o.id}: {o.outcome}"
            + (f" -> {o.target}" if o.target else "")
            + (f" ({escape(o.detail)})" if o.detail else ""),
            soft_wrap=True,
        )
    appended = sum(o.outcome == "redriven" for o in outcomes)
    console.print(f"{appended} of {len(outcomes)} dead letters redriven to {name}'s topics")
