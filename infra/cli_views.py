"""CLI: the Spark views (`run-views`, `replay VIEW`, `views`, `spark-archive`).

``run_views`` and ``views_status`` are also what ``tributary run views`` and
``tributary status`` call.
"""

import json
import signal
import sys
import threading
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from infra.cli_app import JsonFlag, app, console, err_console, fail, settings, write_class_archive
from tributary.errors import TributaryError
from tributary.redact import redact, redact_data

if TYPE_CHECKING:
    from infra.settings import Settings
    from spark_streaming.replay import ReplayResult
    from spark_streaming.view_job import BatchReport
    from views.catalog import ViewsConfig
    from views.status import ViewStatus


def _spark(s: "Settings", config: "ViewsConfig") -> Any:
    from spark_streaming.session import spark_session

    return spark_session(
        config.spark_master,
        "tributary-views",
        driver_memory=s.spark_driver_memory,
        local_dir=str((s.home / "spark").resolve()),
        java_options=s.spark_java_options,
        class_archive=s.spark_class_archive_path,
        conf=s.spark_conf,
    )


def run_views(
    s: "Settings",
    stop: threading.Event,
    names: list[str] | None = None,
    metrics_port: int | None = None,
    *,
    standby: bool = False,
) -> None:
    """Run the configured views (or ``names``) until ``stop`` is set; a view whose query fails
    is restarted with backoff; the batches' metrics are served on ``metrics_port`` (default:
    the setting). Raises TributaryError when there is nothing to run. ``standby``: take each
    view only once another process has held it (`tributary run views-standby`)."""
    from connectors.leases import Lease
    from infra.telemetry.batches import ViewBatchMetrics
    from infra.telemetry.endpoint import part_registry, serve_part_metrics
    from infra.views import views_config
    from spark_streaming.runner import ViewRunner
    from views.catalog import configured_views, find_view

    config = views_config(s)
    specs = (
        [find_view(config, n) for n in names] if names else list(configured_views(config).values())
    )
    if not specs:
        raise TributaryError(
            "no views configured: set TRIBUTARY_MIRROR_TABLES (e.g. public.users,public.posts)"
            " or TRIBUTARY_VIEWS (module:function of a view factory)"
        )
    metrics = part_registry()
    batches = ViewBatchMetrics(metrics)
    part = "views-standby" if standby else "views"
    endpoint = serve_part_metrics(s, part, metrics, metrics_port)
    if endpoint is not None:
        console.log(f"{part}: metrics at {endpoint.url}")
    spark = _spark(s, config)
    try:
        ViewRunner(
            spark,
            specs,
            config.kafka,
            config.job_options(),
            log=lambda line: console.log(escape(redact(line))),
            replay_options=config.job_options(replay=True),
            lease_for=lambda name: Lease(s.postgres().dsn, name),
            on_batch=batches.observe,
            on_phases=batches.observe_phases,
            standby=standby,
            share=s.views_share_query,
        ).run(stop)
    finally:
        spark.stop()


def views_status(s: "Settings") -> list["ViewStatus"]:
    """Each configured view's generation, batch id, offsets and lag."""
    from infra.views import views_config
    from views.catalog import configured_views
    from views.status import view_statuses

    config = views_config(s)
    return view_statuses(list(configured_views(config).values()), config.kafka)


@app.command("run-views")
def run_views_command(
    views: Annotated[
        list[str] | None, typer.Argument(help="Views to run (default: every configured view).")
    ] = None,
) -> None:
    """Run the views until SIGTERM/Ctrl-C (those that fold per partition share one query)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        run_views(settings(), stop, views)
    except TributaryError as exc:
        fail(exc)


REFUSED_EXIT = 3  # the generations differ: the swap refused, or found by --check-only
SHOWN = 20  # differences printed per store (--json lists up to 100, all are counted)
VALUE_WIDTH = 60


def _brief(entry: dict[str, Any] | None) -> str:
    """An entry as one short line: its fields as JSON and its position, cut to fit."""
    if entry is None:
        return "-"
    text = json.dumps(entry["fields"], sort_keys=True, separators=(",", ":"), default=str)
    if len(text) > VALUE_WIDTH:
        text = text[: VALUE_WIDTH - 1] + "…"
    return f"{text} @{entry['position']}"


def _print_comparisons(result: "ReplayResult") -> None:
    for c in result.comparisons:
        where = f"{c.kind}: live {c.live} ({c.live_entries} entries) and rebuilt {c.shadow}"
        where += f" ({c.shadow_entries} entries) at {json.dumps(c.live_commit.offsets)}"
        if c.identical:
            console.print(f"{escape(where)}: identical", soft_wrap=True)
            continue
        console.print(f"{escape(where)}: [red]{c.different} differ[/]", soft_wrap=True)
        for d in c.differences[:SHOWN]:
            row = d.as_dict()
            live, shadow = row["live"], row["shadow"]
            kind = d.kind
            if live is not None and shadow is not None:
                # only the fields that differ: a long entry's difference is never cut off
                kind += " (the fields that differ)"
                names = set(live["fields"]) | set(shadow["fields"])
                names = {n for n in names if live["fields"].get(n) != shadow["fields"].get(n)}
                live = {**live, "fields": {n: live["fields"].get(n) for n in sorted(names)}}
                shadow = {**shadow, "fields": {n: shadow["fields"].get(n) for n in sorted(names)}}
            lines = [
                f"  {d.collection} {d.key}: {kind}",
                f"    live:    {_brief(live)}",
                f"    rebuilt: {_brief(shadow)}",
            ]
            console.print(escape(redact("\n".join(lines))), soft_wrap=True, highlight=False)
        if c.different > SHOWN:
            console.print(f"  ... and {c.different - SHOWN} more (--json lists up to 100)")


def _replay_json(result: "ReplayResult", error: str | None = None) -> str:
    out = {
        "view": result.view,
        "generation": result.generation,
        "swapped": result.swapped,
        "replaced": result.replaced,
        "records": result.records,
        "batches": result.batches,
        "compared": result.compared,
        "identical": result.identical if result.compared else None,
        "different": result.different,
        "comparisons": [c.as_dict() for c in result.comparisons],
        "error": error,
    }
    return json.dumps(redact_data(out), default=str) + "\n"


@app.command()
def replay(
    view: Annotated[str, typer.Argument(help="View name, e.g. mirror.public.users.")],
    force: Annotated[
        bool,
        typer.Option("--force", help="Swap even when the rebuilt generation differs."),
    ] = False,
    check_only: Annotated[
        bool,
        typer.Option("--check-only", help="Rebuild and compare, then drop it: never swap."),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Rebuild a view from offset zero into a shadow, compare it with the live view at the same
    source offsets (every store: keys and a digest of each entry), then swap it in atomically.
    Differences are listed and refuse the swap (exit 3) unless --force; --check-only compares
    and never swaps (exit 3 when they differ)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from infra.views import views_config
    from spark_streaming.replay import SwapRefusedError, topic_records
    from spark_streaming.replay import replay as replay_view
    from views.catalog import find_view

    if force and check_only:
        fail("--force and --check-only exclude each other (--check-only never swaps)")
    s = settings()
    config = views_config(s)
    refused: str | None = None
    try:
        spec = find_view(config, view)
        total = topic_records(config.kafka, spec.topics)
        spark = _spark(s, config)
        progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("records"),
            TimeElapsedColumn(),
            console=err_console if as_json else console,
        )
        try:
            with progress:
                task = progress.add_task(f"replay {spec.name}", total=total)

                def advance(report: "BatchReport") -> None:
                    progress.update(task, advance=report.records)

                try:
                    result = replay_view(
                        spark,
                        spec,
                        config.kafka,
                        config.job_options(replay=True),
                        on_batch=advance,
                        force=force,
                        check_only=check_only,
                    )
                except SwapRefusedError as exc:
                    result, refused = exc.result, str(exc)
                progress.update(task, completed=total)
        finally:
            spark.stop()
    except TributaryError as exc:
        fail(exc)
    if as_json:
        sys.stdout.write(_replay_json(result, refused))
    else:
        _print_comparisons(result)
        if not result.compared:
            console.print(
                f"{result.view}: the live generation holds no batch yet; nothing to compare"
            )
    if refused is not None:
        err_console.print(f"[bold red]refused:[/] {escape(redact(refused))}", soft_wrap=True)
        raise typer.Exit(code=REFUSED_EXIT)
    if check_only:
        if not as_json:
            verdict = "identical" if result.identical else f"{result.different} entries differ"
            console.print(
                f"{result.view}: checked, {verdict}; rebuilt generation {result.generation}"
                f" dropped, the live view is unchanged ({result.records} records,"
                f" {result.batches} batches)"
            )
        if not result.identical:
            raise typer.Exit(code=REFUSED_EXIT)
        return
    if not as_json:
        verdict = (
            ""
            if not result.compared
            else (
                ", identical"
                if result.identical
                else f", {result.different} entries differ: forced"
            )
        )
        console.print(
            f"{result.view}: generation {result.generation} is live ({result.records} records,"
            f" {result.batches} batches; replaced {result.replaced or 'nothing'}{verdict})"
        )


@app.command("spark-archive")
def spark_archive_command(
    force: Annotated[
        bool, typer.Option("--force", help="Write it again even if it exists.")
    ] = False,
) -> None:
    """Write the Spark drivers' class-data archive (AppCDS): later drivers start ~5 s sooner."""
    from spark_streaming.class_archive import build_archive

    s = settings()
    write_class_archive(
        s.spark_class_archive_path,
        "TRIBUTARY_SPARK_CLASS_ARCHIVE",
        force,
        lambda archive: build_archive(archive, s.spark_java_options),
    )


@app.command("views")
def views_command(as_json: JsonFlag = False) -> None:
    """Each view: live generation, last batch id, offsets and lag behind its topics."""
    from rich.table import Table

    try:
        statuses = views_status(settings(light=True))
    except TributaryError as exc:
        fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(redact_data([st.as_dict() for st in statuses])) + "\n")
        return
    table = Table("view", "store", "generation", "batch", "offsets", "lag", "metrics")
    for st in statuses:
        table.add_row(
            st.view,
            escape(redact(st.store)) if st.error is None else f"[red]{escape(redact(st.error))}[/]",
            st.generation or "-",
            str(st.batch_id),
            json.dumps(st.offsets),
            str(st.lag),
            " ".join(f"{k}={v}" for k, v in (st.metrics or {}).items()) or "-",
        )
    console.print(table)


@app.command("grant-read-role")
def grant_read_role_command(
    role: Annotated[str, typer.Argument(help="The read-only role (created when missing).")],
    password_stdin: Annotated[
        bool,
        typer.Option(
            "--password-stdin", help="Read the role's password from the first line of stdin."
        ),
    ] = False,
    writer: Annotated[
        str | None,
        typer.Option(
            help="The role that runs the view jobs and creates their tables [default: the"
            " user of TRIBUTARY_POSTGRES_URL]."
        ),
    ] = None,
) -> None:
    """Let ROLE read the views' tables (now and those created later) and nothing else; serve
    reads through it with TRIBUTARY_VIEWS_READ_URL."""
    import psycopg

    from connectors.roles import grant_read_role

    s = settings()
    password = sys.stdin.readline().rstrip("\r\n") if password_stdin else None
    if password_stdin and not password:
        fail("--password-stdin: the first line of stdin is empty")
    try:
        with psycopg.connect(s.postgres().dsn, autocommit=True, connect_timeout=10) as conn:
            grant_read_role(conn, s.views_schema, role, password=password, writer=writer)
    except (TributaryError, psycopg.Error) as exc:
        fail(f"cannot grant read access to {role}: {exc}")
    db = s.postgres()
    console.print(
        f"role {escape(role)} can read schema {s.views_schema} (and the tables created there"
        " later) and nothing else; serve through it with TRIBUTARY_VIEWS_READ_URL="
        f"postgresql+psycopg://{escape(role)}:<password>@{db.host}:{db.port}/{db.database}",
        soft_wrap=True,
    )


if __name__ == "__main__":  # `python -m infra.cli_views replay VIEW` works before wiring
    app()
