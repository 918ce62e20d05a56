"""CLI: `run` the long-running parts (CDC, the command processor, the views, the HTTP API)."""

import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from infra.cli_app import app, console, err_console, fail, settings
from infra.supervision import Supervisor, metrics_url, parts_file
from tributary.errors import TributaryError
from tributary.redact import redact

if TYPE_CHECKING:
    from infra.settings import Settings

COMPONENTS = ("cdc", "commands", "views", "api")
STANDBY = "views-standby"


def lease_name(component: str, s: "Settings") -> str | None:
    """The lease a component holds while it runs (None: copies may run side by side)."""
    if component == "cdc":
        return f"cdc:{s.cdc_connector_name}"
    # command processors divide the partitions among themselves (infra.commands); views take
    # one lease per view (infra.cli_views); the HTTP API scales out
    return None


def _run_foreground(component: str, s: "Settings", metrics_port: int | None) -> None:
    name = lease_name(component, s)
    if name is not None:
        from connectors.leases import Lease

        def lost(reason: str) -> None:
            err_console.print(f"[bold red]error:[/] {component}: {reason}; stopping")
            os._exit(1)

        Lease(s.postgres().dsn, name).acquire(on_lost=lost)
    if component == "cdc":
        from infra.cli_cdc import run_cdc

        run_cdc(s, metrics_port)
    elif component == "commands":
        from infra.cli_events import run_commands

        run_commands(s, metrics_port)
    elif component == "api":
        from infra.cli_serve import serve

        serve(None, None)
    else:
        from infra.cli_views import run_views

        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        run_views(s, stop, metrics_port=metrics_port, standby=component == STANDBY)


def run_component(component: str, s: "Settings", metrics_port: int | None = None) -> None:
    """Run one component in this process until SIGTERM/Ctrl-C, then exit (its metrics on
    ``metrics_port``, default: the setting)."""
    code = 0
    try:
        _run_foreground(component, s, metrics_port)
    except TributaryError as exc:
        err_console.print(
            f"[bold red]error:[/] {component}: {escape(redact(str(exc)))}", soft_wrap=True
        )
        code = 1
    except typer.Exit as exc:  # a command that failed with its own message
        code = exc.exit_code
    # The JVMs (Debezium, Spark) may keep non-daemon threads alive after a failure, and the
    # exit hooks would wait for them. Everything durable is flushed by now: leave directly.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@app.command()
def run(
    components: Annotated[
        list[str] | None,
        typer.Argument(help=f"Any of {', '.join(COMPONENTS)} (default: all)."),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="Port of the one component's metrics (default: its setting, e.g."
            " TRIBUTARY_VIEWS_METRICS_PORT; 0: none).",
        ),
    ] = None,
) -> None:
    """Run the long-running parts until SIGTERM/Ctrl-C. One component runs in the foreground;
    several run each in its own process, restarted with backoff if it dies. Each serves its
    Prometheus metrics on its own port (`tributary status` lists them)."""
    chosen = list(dict.fromkeys(components or COMPONENTS))
    # views-standby: a second views process that only takes over (never in the default set).
    unknown = [c for c in chosen if c not in (*COMPONENTS, STANDBY)]
    if unknown:
        fail(f"unknown component(s) {', '.join(unknown)}: choose from {', '.join(COMPONENTS)}")
    s = settings()
    if len(chosen) == 1:
        run_component(chosen[0], s, metrics_port)
        return
    if metrics_port is not None:
        fail("--metrics-port names the port of one component: run several with their settings")
    from connectors.leases import prepare

    try:  # the parts take leases: create their table once, before they start together
        prepare(s.postgres().dsn)
    except Exception as exc:  # psycopg.Error: each part reports it again as it starts
        err_console.print(f"[yellow]warning:[/] leases not prepared: {escape(redact(str(exc)))}")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    parts = list(chosen)
    if "views" in chosen and s.views_standby:
        parts.append(STANDBY)  # a warm second views process takes over at once

    def argv(name: str) -> list[str]:
        command = [sys.executable, "-m", "infra.cli", "run", name]
        if name != "api":
            command += ["--metrics-port", str(s.metrics_port(name))]
        return command

    supervisor = Supervisor(
        parts,
        argv,
        (s.home / "logs").resolve(),
        announce=lambda line: console.print(f"run: {line}"),
        state_file=parts_file(s),
        metrics_for=lambda name: metrics_url(s, name),
    )
    if s.verify_interval_s > 0:
        from infra.verify import VerifyLoop

        VerifyLoop(s, s.verify_interval_s, stop).start()
    supervisor.run(stop)
    console.print("run: all components stopped")


@app.command()
def demo() -> None:
    """The social-network demo end to end on the local stack: users by SQL and commands through
    Kafka and HTTP -> CDC -> the search index, profile cache and home timeline, a rename, a
    delete, a replay. Exits 0 when every check held."""
    from infra.plugins import load_named

    s = settings()
    try:
        run_demo, _ = load_named(s.demo, "the demo", "TRIBUTARY_DEMO", "run_demo")
        ok = run_demo(s, console)
    except (TributaryError, TimeoutError) as exc:
        fail(str(exc))
    if not ok:
        fail("some demo checks failed (see the summary)")
