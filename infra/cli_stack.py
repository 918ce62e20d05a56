"""CLI: the local stack and topics (`up`, `down`, `status`, `topics`)."""

import json
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from infra.cli_app import JsonFlag, app, console, fail, settings
from tributary.errors import TributaryError
from tributary.redact import redact_data

if TYPE_CHECKING:
    from infra.settings import Settings
    from infra.stack import ComponentStatus


@app.command()
def up(
    spark_workers: Annotated[
        int | None,
        typer.Option(
            "--spark-workers",
            min=0,
            help="Also run a Spark standalone master with N workers (0: none); the view and"
            " analytics jobs then run on it. Kept for later `up`s until changed.",
        ),
    ] = None,
    containers: Annotated[
        bool,
        typer.Option(
            "--containers",
            help="Run the services as containers of the repository's images (podman or Docker;"
            " docs/containers.md) instead of processes. Kept for later commands until"
            " `down --purge`.",
        ),
    ] = False,
) -> None:
    """Start the local stack (PostgreSQL, object store + broker, Redis, schema registry, and a
    Spark cluster if asked); idempotent."""
    from infra.containers import local as in_containers
    from infra.stack import LocalStack

    s = settings()
    started = time.monotonic()
    if containers or in_containers.recorded(s) is not None:
        if any(c.state == "up" for c in LocalStack(s).status()):
            fail(TributaryError("the stack runs as processes: `tributary down` it first"))
        try:
            statuses = in_containers.up(s)
        except TributaryError as exc:
            fail(exc)
        print_status(statuses)
        console.print(
            f"stack up in {time.monotonic() - started:.1f}s (containers; state: {s.home})"
        )
        return
    stack = LocalStack(s, spark_workers=spark_workers)
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
    from infra.containers import local as in_containers
    from infra.stack import LocalStack

    s = settings()
    if in_containers.recorded(s) is not None:
        in_containers.down(s, purge=purge)
    LocalStack(s).down(purge=purge)
    console.print("stack stopped" + (" and purged" if purge else " (data kept)"))


@app.command()
def status(as_json: JsonFlag = False) -> None:
    """Each component (up/down, endpoint, PID), the long-running parts (state, restarts, metrics
    endpoint), the CDC connector and the views' positions."""
    from infra.containers.local import STATE_FILE
    from infra.stack import LocalStack

    s = settings(light=True)
    if (s.home.resolve() / STATE_FILE).exists():  # `up --containers`
        from infra.containers import local as in_containers

        s = settings()
        statuses = in_containers.status(s)
    else:
        statuses = LocalStack(s).status()
    rows: list[dict[str, object]] = [c.as_dict() for c in statuses]
    rows += part_rows(s)
    services_up = {c.name for c in statuses if c.state == "up"}
    if s.kafka_bootstrap_servers is not None or {"postgres", "broker"} <= services_up:
        rows += runtime_rows(s)
    rows = redact_data(rows)  # errors of drivers can quote a connection string
    if as_json:
        sys.stdout.write(json.dumps(rows, default=str) + "\n")
        return
    print_status(statuses)
    extra = rows[len(statuses) :]
    if extra:
        from rich.table import Table

        table = Table("part", "state", "endpoint", "position", "detail")
        for row in extra:
            table.add_row(
                str(row["name"]),
                str(row["state"]),
                str(row.get("endpoint") or "-"),
                str(row.get("position", "-")),
                str(row.get("detail", "")),
            )
        console.print(table)


def part_rows(s: "Settings") -> list[dict[str, object]]:
    """Each long-running part: as `tributary run` last saw it (``parts.json``), and where its
    metrics answer (from the settings)."""
    from infra.cli_run import COMPONENTS, STANDBY
    from infra.supervision import metrics_url, parts_file, read_state

    state = read_state(parts_file(s))
    seen = state.get("parts") if state is not None else None
    listed = seen if isinstance(seen, list) else []
    known = {str(p["name"]): p for p in listed if isinstance(p, dict)}
    names = [*COMPONENTS, *([STANDBY] if STANDBY in known else [])]
    rows: list[dict[str, object]] = []
    for name in names:
        part = known.get(name, {})
        restarts = part.get("restarts", 0)
        rows.append(
            {
                "name": f"part:{name}",
                "state": str(part.get("state", "not supervised")),
                "endpoint": metrics_url(s, name) or "no metrics",
                "pid": part.get("pid"),
                "restarts": restarts,
                "detail": f"restarts {restarts}" if part else "not started by `tributary run`",
            }
        )
    return rows


def print_status(statuses: list["ComponentStatus"]) -> None:
    from rich.table import Table

    modes = sorted({c.mode for c in statuses})
    table = Table("component", "state", "endpoint", "pid", title=f"mode: {', '.join(modes)}")
    for c in statuses:
        color = "green" if c.state == "up" else "red"
        table.add_row(c.name, f"[{color}]{c.state}[/]", c.endpoint, str(c.pid or "-"))
    console.print(table)


def runtime_rows(s: "Settings") -> list[dict[str, object]]:
    """The connector and each view as status rows (never fails: errors become the state)."""
    from infra.cli_views import views_status
    from infra.connector_state import cdc_status

    rows: list[dict[str, object]] = []
    try:
        from infra.connector_state import wal_line

        cdc = cdc_status(s)
        last = cdc["last_change_at"]
        rows.append(
            {
                **cdc,
                "connector": cdc["name"],
                "name": "cdc",
                "state": cdc["state"] if not cdc["warning"] else f"{cdc['state']} (warning)",
                "endpoint": f"slot {cdc['slot']}",
                "pid": cdc["pid"],
                "position": f"lsn {cdc['last_lsn']}",
                "detail": (f"WARNING: {cdc['warning']}; " if cdc["warning"] else "")
                + f"retained WAL {wal_line(cdc)}, last change "
                + (
                    time.strftime("%H:%M:%S", time.localtime(last))
                    if isinstance(last, float)
                    else "-"
                ),
            }
        )
    except Exception as exc:
        rows.append({"name": "cdc", "state": f"unknown ({exc})", "endpoint": "", "pid": None})
    try:
        for view in views_status(s):
            rows.append(
                {
                    "name": f"view:{view.view}",
                    "state": view.error or ("caught up" if view.lag == 0 else "behind"),
                    "endpoint": f"{view.store} ({view.generation or 'not run yet'})",
                    "pid": None,
                    "position": f"batch {view.batch_id}",
                    "detail": f"lag {view.lag}, offsets {view.offsets}"
                    + "".join(f", {k} {v}" for k, v in (view.metrics or {}).items()),
                    "batch_id": view.batch_id,
                    "offsets": view.offsets,
                    "lag": view.lag,
                    "metrics": view.metrics,
                }
            )
    except Exception as exc:
        rows.append({"name": "views", "state": f"unknown ({exc})", "endpoint": "", "pid": None})
    try:
        rows += command_owner_rows(s)
    except Exception as exc:
        rows.append({"name": "commands", "state": f"unknown ({exc})", "endpoint": "", "pid": None})
    from infra.verify import read_last

    last = read_last(s)
    if last is not None:
        rows.append(
            {
                "name": "verify",
                "state": "ok" if last.get("ok") else "differences",
                "endpoint": time.strftime("%H:%M:%S", time.localtime(float(last.get("at", 0)))),
                "pid": None,
                "detail": "source of truth = topics and views"
                if last.get("ok")
                else "run `tributary verify` for details, `tributary repair` to fix the topics",
                "verify": last,
            }
        )
    return rows


def command_owner_rows(s: "Settings") -> list[dict[str, object]]:
    """Which command processor owns which partition of ``commands`` (none before the first
    processor started)."""
    from connectors.partition_owners import owners
    from infra.commands import ownership_group

    held = owners(s.postgres().dsn, ownership_group(s))
    if not held:
        return []
    by_owner: dict[str, list[int]] = {}
    for partition, (owner, _epoch) in sorted(held.items()):
        by_owner.setdefault(owner or "(none)", []).append(partition)
    processors = len([o for o in by_owner if o != "(none)"])
    return [
        {
            "name": "commands",
            "state": f"{processors} processor(s)",
            "endpoint": s.commands_topic,
            "pid": None,
            "detail": "; ".join(
                f"{owner}: partitions {', '.join(map(str, parts))}"
                for owner, parts in by_owner.items()
            ),
            "owners": {
                str(partition): {"owner": owner, "epoch": epoch}
                for partition, (owner, epoch) in sorted(held.items())
            },
        }
    ]


@app.command()
def topics(as_json: JsonFlag = False) -> None:
    """Topics with partitions, end offsets and cleanup.policy."""
    from rich.table import Table

    from connectors.kafka.admin import TopicAdmin

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
