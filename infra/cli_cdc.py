"""CLI: change data capture (`run cdc`, `snapshot`, `connector-config`, `cdc-status`)."""

import json
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from connectors.kafka.config import is_secret_property
from infra.cli_app import JsonFlag, app, console, fail, settings
from tributary.redact import redact_data

if TYPE_CHECKING:
    from cdc.connector import ConnectorRuntime
    from infra.settings import Settings

ChangeFormat = Literal["json", "avro"]  # = connectors.debezium.ChangeFormat (not imported: slow)


def cdc_runtime(s: "Settings") -> "ConnectorRuntime":
    # Imported here: the engine's modules (JPype) are only needed by the commands that use them.
    from cdc.connector import ConnectorRuntime

    return ConnectorRuntime(
        state_dir=s.cdc_state_dir.resolve(),
        log_dir=(s.home / "logs").resolve(),
        topic_partitions=s.cdc_topic_partitions,
    )


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


def cdc_status(s: "Settings") -> dict[str, object]:
    """Connector state (from its status file and PID), slot's retained WAL, last change."""
    from cdc.slots import slot_info
    from cdc.status import StatusFile
    from infra.stack.process import is_alive

    config = s.debezium()
    status = StatusFile(cdc_runtime(s).status_file(config.name)).read()
    state = "not started"
    if status is not None:
        state = status.state
        if state in ("starting", "running", "stopping") and not is_alive(status.pid):
            state = "dead"
    try:
        slot = slot_info(s.postgres(), config.slot_name)
    except Exception:
        slot = None
    used = slot.budget_used() if slot else None
    warning = None
    if slot is not None and slot.invalidated:
        warning = (
            f"slot {config.slot_name} was invalidated (it held back more WAL than"
            " max_slot_wal_keep_size): the connector recovers with a fresh snapshot at its"
            " next start; run `tributary verify` after it"
        )
    elif slot is not None and slot.wal_status == "unreserved":
        warning = (
            f"slot {config.slot_name} is past its WAL budget: it is lost at the next checkpoint"
        )
    elif used is not None and used >= s.cdc_wal_warn_ratio:
        warning = (
            f"slot {config.slot_name} holds back {used:.0%} of its WAL budget"
            f" ({slot.retained_wal_bytes if slot else 0} of {slot.budget_bytes if slot else 0}"
            " bytes): is the connector running? (`tributary run cdc`)"
        )
    return {
        "name": config.name,
        "state": state,
        "pid": status.pid if status else None,
        "records_published": status.records_published if status else 0,
        "last_change_at": status.last_change_at if status else None,
        "last_lsn": status.last_lsn if status else None,
        "slot": config.slot_name,
        "slot_active": slot.active if slot else None,
        "retained_wal_bytes": slot.retained_wal_bytes if slot else None,
        "wal_budget_bytes": slot.budget_bytes if slot else None,
        "wal_status": slot.wal_status if slot else None,
        "warning": warning,
        "recovered": status.recovered if status else None,
        "error": status.error if status else None,
    }


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


def wal_line(info: dict[str, object]) -> str:
    """Retained WAL against the budget, e.g. ``12.0 MB of 2048 MB (reserved)``."""
    retained, budget = info.get("retained_wal_bytes"), info.get("wal_budget_bytes")
    if not isinstance(retained, int):
        return "-"
    text = f"{retained / 2**20:.1f} MB"
    if isinstance(budget, int):
        text += f" of {budget / 2**20:.0f} MB"
    if info.get("wal_status"):
        text += f" ({info['wal_status']})"
    return text
