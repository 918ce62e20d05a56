"""The ``tributary`` command line."""

import json
import sys
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from connectors.kafka.admin import TopicAdmin
from infra.settings import Settings, load_settings
from infra.stack import LocalStack
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


def _settings() -> Settings:
    return load_settings()


def _fail(exc: TributaryError) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {exc}")
    return typer.Exit(code=1)


@app.command()
def up() -> None:
    """Start the local stack (PostgreSQL, object store + broker, Redis); idempotent."""
    stack = LocalStack(_settings())
    started = time.monotonic()
    try:
        statuses = stack.up()
    except TributaryError as exc:
        raise _fail(exc) from exc
    _print_status(statuses)
    console.print(f"stack up in {time.monotonic() - started:.1f}s (state: {stack.home})")


@app.command()
def down(
    purge: Annotated[bool, typer.Option("--purge", help="Also delete all data.")] = False,
) -> None:
    """Stop the local stack gracefully; data is kept unless --purge."""
    stack = LocalStack(_settings())
    stack.down(purge=purge)
    console.print("stack stopped" + (" and purged" if purge else " (data kept)"))


@app.command()
def status(as_json: JsonFlag = False) -> None:
    """Each component: up/down, endpoint, PID."""
    statuses = LocalStack(_settings()).status()
    if as_json:
        sys.stdout.write(json.dumps([s.as_dict() for s in statuses]) + "\n")
    else:
        _print_status(statuses)


def _print_status(statuses: list) -> None:  # type: ignore[type-arg]
    table = Table("component", "state", "endpoint", "pid")
    for s in statuses:
        color = "green" if s.state == "up" else "red"
        table.add_row(s.name, f"[{color}]{s.state}[/]", s.endpoint, str(s.pid or "-"))
    console.print(table)


@app.command()
def topics(as_json: JsonFlag = False) -> None:
    """Topics with partitions, end offsets and cleanup.policy."""
    try:
        infos = TopicAdmin(_settings().kafka("tributary-cli")).describe()
    except TributaryError as exc:
        raise _fail(exc) from exc
    if as_json:
        sys.stdout.write(json.dumps([i.as_dict() for i in infos]) + "\n")
        return
    table = Table("topic", "partitions", "end offsets", "cleanup.policy")
    for info in infos:
        ends = ", ".join(f"{p.partition}:{p.end_offset}" for p in info.partitions)
        table.add_row(info.name, str(len(info.partitions)), ends, info.cleanup_policy or "?")
    console.print(table)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
