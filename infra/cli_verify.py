"""CLI: `tributary verify [--json]` and `tributary repair [--json]`."""

import json
import sys
from typing import Annotated

import typer
from rich.table import Table

from infra.cli_app import JsonFlag, app, console, settings

FullFlag = Annotated[
    bool,
    typer.Option(
        "--full",
        help="Read every topic from its start (by default only what it gained since the last"
        " verify).",
    ),
]


@app.command("verify")
def verify_command(as_json: JsonFlag = False, full: FullFlag = False) -> None:
    """Compare the source of truth (tables, event store) with the topics and every view;
    exit 0 when nothing is missing, stale or wrong, 1 otherwise."""
    from infra.verify import verify, write_last

    s = settings()
    report = verify(s, full=full)
    result = report.as_dict()
    write_last(s, result)
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        table = Table("part", "checked", "result")
        for t in report.tables:
            found = f"{len(t.missing)} missing, {len(t.stale)} stale, {len(t.extra)} extra"
            table.add_row(
                f"{t.table} -> {t.topic}",
                f"{t.rows} rows; {_read(t.read, t.whole)}",
                "ok" if t.ok else f"[red]{found}[/]",
            )
        if report.events is not None:
            e = report.events
            table.add_row(
                "event store -> events.*",
                f"{e.events} events; {_read(e.read, e.whole)}",
                ("ok" if e.ok else f"[red]{len(e.missing)} missing, {len(e.unknown)} unknown[/]")
                + (f" ({e.duplicated} re-delivered, harmless)" if e.duplicated else ""),
            )
        for name, differences in report.views.items():
            lag = report.lag.get(name)
            table.add_row(
                f"view {name}",
                f"lag {lag}" if lag is not None else "-",
                "ok" if not differences else "[red]" + "; ".join(differences) + "[/]",
            )
        for error in report.errors:
            table.add_row("[red]error[/]", "", error)
        console.print(table)
        if not report.ok:
            console.print(
                "Run `tributary repair` to re-publish what the topics lack; views still behind"
                " their topics (lag) catch up as their jobs run."
            )
    raise SystemExit(0 if report.ok else 1)


def _read(records: int, whole: bool) -> str:
    return f"{records} records read" + (" (whole topic)" if whole else " (since last verify)")


@app.command("repair")
def repair_command(as_json: JsonFlag = False) -> None:
    """Re-publish missing events from the event store, re-snapshot missing or stale rows,
    delete keys the tables no longer have; the views then converge."""
    from infra.verify import repair

    done = repair(settings())
    if as_json:
        sys.stdout.write(json.dumps(done) + "\n")
        return
    console.print(f"events re-published: {done['events_republished']}")
    for table, what in done["tables"].items():
        console.print(f"{table}: {what}")
    console.print("The views converge as their jobs run; check with `tributary verify`.")
