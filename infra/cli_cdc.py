"""CLI: change data capture (`run cdc`, `snapshot`, `connector-config`, `cdc-status`,
`cdc-archive`)."""

import json
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from connectors.kafka.config import is_secret_property
from infra.cli_app import JsonFlag, app, console, fail, settings, write_class_archive
from infra.connector_state import cdc_runtime, cdc_status, wal_line
from tributary.redact import redact_data

if TYPE_CHECKING:
    from infra.settings import Settings

ChangeFormat = Literal["json", "avro"]  # = connectors.debezium.ChangeFormat (not imported: slow)


def run_cdc(s: "Settings", metrics_port: int | None = None) -> None:
    """Run the connector in this process until SIGTERM/SIGINT (finish the batch, commit, exit);
    its metrics are served on ``metrics_port`` (default: the setting)."""
    from cdc.connector import CdcConnector
    from cdc.slots import set_replica_identity_full, slot_info
    from infra.telemetry.cdc import ConnectorCollector, SlotCollector
    from infra.telemetry.endpoint import part_registry, serve_part_metrics

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if s.cdc_replica_identity_full:
        set_replica_identity_full(s.postgres(), list(s.cdc_replica_identity_full))
    config = s.debezium()
    connector = CdcConnector(
        config, s.kafka(f"tributary-cdc-{s.cdc_connector_name}"), cdc_runtime(s)
    )
    metrics = part_registry()
    metrics.register(ConnectorCollector(config.name, lambda: connector.status))
    slot = config.slot_name
    metrics.register(SlotCollector(slot, lambda: slot_info(s.postgres(), slot)))
    endpoint = serve_part_metrics(s, "cdc", metrics, metrics_port)
    console.print(
        f"cdc: connector {s.cdc_connector_name} capturing {', '.join(s.cdc_tables)} "
        f"into {s.cdc_topic_prefix}.<schema>.<table> (slot {config.slot_name})"
        + (f"; metrics at {endpoint.url}" if endpoint is not None else "")
    )
    connector.run(stop)
    console.print(f"cdc: stopped cleanly after {connector.status.records_published} changes")


@app.command()
def snapshot(
    tables: Annotated[list[str], typer.Argument(help="Tables to re-read, as schema.table.")],
) -> None:
    """Ask the running connector for an incremental snapshot of TABLES while streaming goes on."""
    from cdc.signals import ensure_signal_table, request_incremental_snapshot

    s = settings()
    unknown = [t for t in tables if t not in s.cdc_tables]
    if unknown:
        fail(
            f"not captured by connector {s.cdc_connector_name}: {', '.join(unknown)} "
            f"(TRIBUTARY_CDC_TABLES is {','.join(s.cdc_tables)})"
        )
    try:
        ensure_signal_table(s.postgres())
        signal_id = request_incremental_snapshot(s.postgres(), tables)
    except Exception as exc:
        fail(f"cannot write the snapshot signal: {exc}")
    console.print(f"incremental snapshot of {', '.join(tables)} requested (signal {signal_id})")


SECRETS_FILE = "/opt/kafka/secrets/tributary.properties"


@app.command("connector-config")
def connector_config(
    show_password: Annotated[bool, typer.Option(help="Print the real password.")] = False,
    change_format: Annotated[
        ChangeFormat,
        typer.Option(
            "--format",
            help="Change events of the tables: json (what Tributary's views read) or avro"
            " (Confluent's AvroConverter against the schema registry).",
        ),
    ] = "json",
) -> None:
    """Print the equivalent Kafka Connect connectors as a JSON list (for a Connect cluster:
    one ``POST /connectors`` each): the tables, and the event store's outbox.

    Without --show-password the database password (and any secret-looking property) is a
    FileConfigProvider reference. Kafka's own connection (brokers, SASL/TLS) is the Connect
    worker's configuration, never part of this JSON."""
    connectors = settings().debezium().kafka_connect_config(not show_password, change_format)
    if not show_password:
        connectors = [hide_secrets(c) for c in connectors]
    sys.stdout.write(json.dumps(connectors, indent=2) + "\n")


def hide_secrets(exported: dict[str, object]) -> dict[str, object]:
    """The exported JSON with every secret-looking property a ``${file:...}`` reference and
    any other password masked."""
    body = exported.get("config")
    if not isinstance(body, dict):
        return redact_data(exported)
    hidden = {
        key: value
        if key == "database.password" or not is_secret_property(key)
        else f"${{file:{SECRETS_FILE}:{key}}}"
        for key, value in body.items()
    }
    return {**exported, "config": redact_data(hidden)}


@app.command("cdc-archive")
def cdc_archive_command(
    force: Annotated[
        bool, typer.Option("--force", help="Write it again even if it exists.")
    ] = False,
) -> None:
    """Write the CDC engine's class-data archive (AppCDS): its JVM then starts with less CPU."""
    from cdc.class_archive import build_archive

    archive = settings().cdc_class_archive_path
    write_class_archive(archive, "TRIBUTARY_CDC_CLASS_ARCHIVE", force, build_archive)


@app.command("cdc-status")
def cdc_status_command(as_json: JsonFlag = False) -> None:
    """The connector: state, changes published, last change time, the slot's retained WAL."""
    from rich.table import Table

    info = redact_data(cdc_status(settings()))
    if as_json:
        sys.stdout.write(json.dumps(info) + "\n")
        return
    table = Table("connector", "state", "published", "last change", "slot", "retained WAL")
    last = info["last_change_at"]
    table.add_row(
        str(info["name"]),
        str(info["state"]),
        str(info["records_published"]),
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last))
        if isinstance(last, float)
        else "-",
        str(info["slot"]),
        wal_line(info),
    )
    console.print(table)
    if info["warning"]:
        console.print(f"[bold yellow]warning:[/] {info['warning']}")
    if info["recovered"]:
        console.print(f"recovered: {info['recovered']}")
