"""Where the CDC connector stands: its status file (written by the running connector), its
PID, and its replication slot's WAL against the budget (what `cdc-status`, `status`, the
dashboard and the metrics show)."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cdc.connector import ConnectorRuntime
    from infra.settings import Settings

__all__ = ["cdc_runtime", "cdc_status", "wal_line"]


def cdc_runtime(s: "Settings") -> "ConnectorRuntime":
    # Imported here: the engine's modules (JPype) are only needed by the commands that use them.
    from cdc.connector import ConnectorRuntime

    return ConnectorRuntime(
        state_dir=s.cdc_state_dir.resolve(),
        log_dir=(s.home / "logs").resolve(),
        topic_partitions=s.cdc_topic_partitions,
        java_options=s.cdc_java_options,
        class_archive=s.cdc_class_archive_path,
        publisher=s.cdc_publisher,
    )


def cdc_status(s: "Settings") -> dict[str, object]:
    """Connector state (from its status file and PID), slot's retained WAL, last change."""
    from cdc.slots import slot_info
    from cdc.status import StatusFile
    from infra.stack.process import is_alive

    config = s.debezium()
    # = cdc_runtime(s).status_file(name), without importing the connector's modules (slow)
    status = StatusFile(s.cdc_state_dir.resolve() / f"{config.name}.status.json").read()
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
        "publisher": status.publisher if status else None,
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
