"""The Typer application and console shared by every CLI module."""

from typing import Annotated, NoReturn

import typer
from rich.console import Console

from infra.settings import Settings, load_settings
from tributary.errors import TributaryError

app = typer.Typer(
    name="tributary",
    help="Kafka-centric CDC and event sourcing: Debezium, an append-only event store, Spark views.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def settings() -> Settings:
    return load_settings()


def fail(exc: TributaryError | str) -> NoReturn:
    """Print the error (which says what to do next) and exit 1."""
    err_console.print(f"[bold red]error:[/] {exc}")
    raise typer.Exit(code=1)
