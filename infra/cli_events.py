"""CLI: the event store's command processor and a command sender.

``tributary run-commands`` (and ``run_commands`` for ``tributary run commands``) consumes the
``commands`` topic until SIGTERM/Ctrl-C; ``tributary command TYPE --data JSON [--wait]``
sends one command through the topic and, with ``--wait``, prints its result as JSON; with
``--wait-views`` it then waits until every configured view reading the command's topic has
applied it (exit 3, naming the lagging views, when they do not within the timeout).
"""

import json
import signal
import sys
import time
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from infra.cli_app import app, console, err_console, fail, settings
from tributary.errors import TributaryError
from tributary.redact import redact

if TYPE_CHECKING:
    from event_store import CommandRegistry
    from infra.settings import Settings


def run_commands(s: "Settings", metrics_port: int | None = None) -> None:
    """Create what is missing (schema, topics, the domain's tables), then process commands;
    the processor's metrics are served on ``metrics_port`` (default: the setting)."""
    from connectors.partition_owners import prepare as prepare_ownership
    from connectors.postgres import make_engine
    from event_store.command_topic import CommandProcessor, ensure_topics
    from infra.commands import (
        command_bus,
        command_ownership,
        command_topics,
        load_registry,
        prepare_database,
        register_schemas,
    )
    from infra.telemetry.commands import CommandMetrics
    from infra.telemetry.endpoint import part_registry, serve_part_metrics

    prepare_ownership(s.postgres().dsn)  # the database first: the partitions are owned there
    registry, module = load_registry(s.command_handlers)
    register_schemas(s, registry)  # before anything: an incompatible event type stops here
    engine = make_engine(s.postgres())
    prepare_database(s, engine, module)
    bus = command_bus(s, engine, registry)
    topics = command_topics(s)
    kafka = s.kafka("tributary-commands")
    ensure_topics(kafka, topics)
    metrics = part_registry()
    counts = CommandMetrics(metrics, "topic")
    endpoint = serve_part_metrics(s, "commands", metrics, metrics_port)
    ownership = command_ownership(s, kafka)
    processor = CommandProcessor(
        bus,
        kafka,
        topics,
        consumer_name=s.command_processor_name,
        observer=counts.observe,
        ownership=ownership,
        linger_ms=s.command_results_linger_ms,
        exactly_once=s.command_results_exactly_once,
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        processor.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    console.print(
        f"processing {topics.commands} → {topics.results} "
        f"(handlers {s.command_handlers}, store schema {s.event_store_schema}; member"
        f" {ownership.member} of {ownership.group}, timeout {ownership.timeout_s:g} s)"
    )
    if endpoint is not None:
        console.print(f"metrics at {endpoint.url}")
    processor.run()
    console.print(f"stopped after {processor.handled} commands")


@app.command("run-commands")
def run_commands_command() -> None:
    """Consume the commands topic and write each result to command-results (until Ctrl-C)."""
    try:
        run_commands(settings())
    except TributaryError as exc:
        fail(exc)


@app.command()
def command(
    command_type: Annotated[
        str, typer.Argument(metavar="TYPE", help="Command type, e.g. CreatePost.")
    ],
    data: Annotated[
        str, typer.Option("--data", help="The command's data as a JSON object.")
    ] = "{}",
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the result; print it.")] = False,
    wait_views: Annotated[
        bool,
        typer.Option(
            "--wait-views",
            help="Wait for the result, then until every view reading the command's topic "
            "applied it (exit 3 naming the views that did not).",
        ),
    ] = False,
    command_id: Annotated[
        str | None, typer.Option("--id", help="Command id (default: a new UUID).")
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait with --wait or --wait-views, in all.")
    ] = 30.0,
) -> None:
    """Send a command through the commands topic; with --wait print its result as JSON."""
    from event_store.command_client import CommandClient
    from infra.commands import command_topics, load_registry

    started = time.monotonic()
    try:
        parsed = json.loads(data)
    except json.JSONDecodeError as exc:
        fail(f"--data is not JSON: {exc}")
    if not isinstance(parsed, dict):
        fail("--data must be a JSON object")
    s = settings(light=True)
    try:
        registry: CommandRegistry | None = load_registry(s.command_handlers)[0]
    except TributaryError:
        registry = None  # only used to choose the message key
    client = CommandClient(s.kafka("tributary-cli"), command_topics(s), registry, one_shot=True)
    try:
        if not (wait or wait_views):
            sent = client.send(command_type, parsed, command_id)
            sys.stdout.write(json.dumps({"status": "sent", "command_id": sent}) + "\n")
            return
        result = client.send_and_wait(command_type, parsed, command_id, timeout=timeout)
    except TributaryError as exc:
        fail(exc)
    sys.stdout.write(json.dumps(result.to_json()) + "\n")
    if result.status == "rejected":
        raise typer.Exit(code=2)
    if wait_views:
        _wait_views(s, result.position_token, timeout - (time.monotonic() - started))


def _wait_views(s: "Settings", token: str, timeout: float) -> None:
    """Exit 3 naming the views that did not apply ``token`` within ``timeout``."""
    from infra.views import view_waiter
    from views.read_your_writes import ViewsLaggingError

    try:
        waiter = view_waiter(s)
    except TributaryError as exc:
        fail(exc)
    try:
        waiter.wait(token, max(timeout, 0.0))
    except ViewsLaggingError as exc:
        err_console.print(f"views lagging: {redact(str(exc))}", markup=False, soft_wrap=True)
        raise typer.Exit(code=3) from None
    finally:
        waiter.close()
