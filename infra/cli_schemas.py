"""CLI: the schema registry (``tributary schemas``, ``schemas show``, ``schemas check``, and
``schemas serve``, which runs the registry itself; ``tributary up`` starts it that way).

Every command but ``serve`` talks to the registry at ``TRIBUTARY_SCHEMA_REGISTRY_URL`` (or the
local stack's), so they work against any registry speaking Confluent's REST API.
"""

import errno
import json
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from infra.cli_app import FastTyper, JsonFlag, app, console, fail, settings
from tributary.errors import TributaryError

schemas_app = FastTyper(
    name="schemas",
    help="Subjects of the schema registry; `show`, `check` a schema, `serve` the registry.",
    invoke_without_command=True,
    no_args_is_help=False,
)
app.add_typer(schemas_app)


if TYPE_CHECKING:
    from connectors.schema_registry.client import RegistryClient


def _client() -> "RegistryClient":
    from connectors.schema_registry.client import RegistryClient

    return RegistryClient(settings().registry_url)


@schemas_app.callback()
def schemas(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Each subject with its latest version, schema id and compatibility level."""
    if ctx.invoked_subcommand is not None:
        return
    client = _client()
    try:
        rows: list[dict[str, Any]] = []
        for subject in client.subjects():
            latest = client.version(subject)
            rows.append(
                {
                    "subject": subject,
                    "version": latest["version"],
                    "id": latest["id"],
                    "versions": len(client.versions(subject)),
                    "compatibility": client.level(subject),
                    "type": latest.get("schemaType", "AVRO"),
                }
            )
    except TributaryError as exc:
        fail(exc)
    finally:
        client.close()
    if as_json:
        sys.stdout.write(json.dumps(rows) + "\n")
        return
    table = Table("subject", "latest version", "id", "versions", "compatibility", "type")
    for row in rows:
        table.add_row(*(escape(str(row[k])) for k in row))
    console.print(table)
    if not rows:
        console.print(f"no subjects in the registry at {client.url}")


@schemas_app.command()
def show(
    subject: str,
    version: Annotated[
        int | None, typer.Option("--version", min=1, help="A version [default: the latest].")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """One version of a subject: its id and the schema."""
    client = _client()
    try:
        found = client.version(subject, "latest" if version is None else version)
    except TributaryError as exc:
        fail(exc)
    finally:
        client.close()
    if as_json:
        sys.stdout.write(json.dumps(found) + "\n")
        return
    console.print(
        f"subject {escape(subject)} version {found['version']} id {found['id']}"
        f" ({found.get('schemaType', 'AVRO')})"
    )
    try:
        document: Any = json.loads(found["schema"])
        console.print_json(json.dumps(document))
    except ValueError:
        console.print(escape(str(found["schema"])))


@schemas_app.command()
def check(
    subject: str,
    file: Annotated[Path, typer.Argument(help="An Avro schema (.avsc JSON).")],
    as_json: JsonFlag = False,
) -> None:
    """Would the registry accept FILE as the next version of SUBJECT? Exit 0 if so, 1 if not."""
    try:
        text = file.read_text()
    except OSError as exc:
        fail(f"cannot read {file}: {exc.strerror}")
    client = _client()
    try:
        problems = client.check(subject, text)
        registered = None if problems else client.lookup(subject, text)
    except TributaryError as exc:
        fail(exc)
    finally:
        client.close()
    if as_json:
        out = {"subject": subject, "compatible": not problems, "messages": problems}
        if registered is not None:
            out["registered"] = {"version": registered["version"], "id": registered["id"]}
        sys.stdout.write(json.dumps(out) + "\n")
    elif problems:
        console.print(f"[red]incompatible[/]: {escape(subject)} would refuse {escape(str(file))}")
        for message in problems:
            console.print(f"  {escape(message)}", soft_wrap=True)
    elif registered is not None:
        console.print(
            f"[green]compatible[/]: already registered as version {registered['version']}"
            f" (id {registered['id']})"
        )
    else:
        console.print(f"[green]compatible[/]: {escape(subject)} would accept it as a new version")
    if problems:
        raise typer.Exit(code=1)


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: without it, uvicorn's answer on a kept-alive
    # connection waited for the client's delayed ACK (40 ms a request).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            fail(
                f"port {port} on {host} is in use: stop what holds it, or choose another port"
                " with --port (or TRIBUTARY_SCHEMA_REGISTRY_PORT)"
            )
        fail(f"cannot listen on {host}:{port} ({exc.strerror}): choose another --host or --port")
    return sock


@schemas_app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="[default: TRIBUTARY_SCHEMA_REGISTRY_PORT]"),
    ] = None,
    bootstrap_servers: Annotated[
        str | None, typer.Option(help="Kafka of the store [default: the settings' Kafka].")
    ] = None,
    topic: Annotated[
        str | None, typer.Option(help="[default: TRIBUTARY_SCHEMA_REGISTRY_TOPIC]")
    ] = None,
) -> None:
    """Run the schema registry (Confluent REST API) on its compacted topic; Ctrl-C stops."""
    import uvicorn

    from connectors.schema_registry.api import create_registry_app
    from connectors.schema_registry.store import open_registry

    s = settings()
    kafka = s.kafka("tributary-schema-registry")
    if bootstrap_servers is not None:
        kafka = type(kafka)(bootstrap_servers, kafka.client_id, kafka.extra)
    topic = topic or s.schema_registry_topic
    sock = _bind(host, s.schema_registry_port if port is None else port)
    try:
        registry, store = open_registry(kafka, topic)
    except TributaryError as exc:
        sock.close()
        fail(exc)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)  # uvicorn stops gracefully, then we exit 0
    server = uvicorn.Server(
        uvicorn.Config(create_registry_app(registry), log_level="warning", access_log=False)
    )
    console.print(
        f"schema registry on http://{host}:{sock.getsockname()[1]} (topic {topic},"
        f" {len(registry.subject_names())} subjects); Ctrl-C stops"
    )
    try:
        server.run(sockets=[sock])
    finally:
        store.close()
        sock.close()
    console.print("stopped")
