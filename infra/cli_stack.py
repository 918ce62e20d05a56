"""CLI: the local stack and topics (`up`, `down`, `status`, `topics`)."""

import json
import sys
import time
from typing import Annotated

import typer
from rich.table import Table

from connectors.kafka.admin import TopicAdmin
from infra.cli_app import JsonFlag, app, console, fail, settings
from infra.stack import ComponentStatus, LocalStack
from tributary.errors import TributaryError


@app.command()
def up() -> None:
    """Start the local stack (PostgreSQL, object store + broker, Redis); idempotent."""
    stack = LocalStack(settings())
    started = time.monotonic()
    try:
        statuses = stack.up()
    except TributaryError as exc:
        fail(exc)
    print_status(statuses)
    console.print(f"stack up in {time.monotonic() - started:.1f}s (state: {stack.home})")


@app.command()
def down(
    purge: Annotated[bool, typer.Option("--purge", help="Also delete all data.")] = False,
) -> None:
    """Stop the local stack gracefully; data is kept unless --purge."""
    LocalStack(settings()).down(purge=purge)
    console.print("stack stopped" + (" and purged" if purge else " (data kept)"))


@app.command()
def status(as_json: JsonFlag = False) -> None:
    """Each component: up/down, endpoint, PID."""
    statuses = LocalStack(settings()).status()
    if as_json:
        sys.stdout.write(json.dumps([s.as_dict() for s in statuses]) + "\n")
    else:
        print_status(statuses)


def print_status(statuses: list[ComponentStatus]) -> None:
    table = Table("component", "state", "endpoint", "pid")
    for s in statuses:
        color = "green" if s.state == "up" else "red"
        table.add_row(s.name, f"[{color}]{s.state}[/]", s.endpoint, str(s.pid or "-"))
    console.print(table)


@app.command()
def topics(as_json: JsonFlag = False) -> None:
    """Topics with partitions, end offsets and cleanup.policy."""
    try:
        infos = TopicAdmin(settings().kafka("tributary-cli")).describe()
    except TributaryError as exc:
        fail(exc)
    if as_json:
        sys.stdout.write(json.dumps([i.as_dict() for i in infos]) + "\n")
        return
    table = Table("topic", "partitions", "end offsets", "cleanup.policy")
    for info in infos:
        ends = ", ".join(f"{p.partition}:{p.end_offset}" for p in info.partitions)
        table.add_row(info.name, str(len(info.partitions)), ends, info.cleanup_policy or "?")
    console.print(table)
