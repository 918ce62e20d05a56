"""A trigger's phases from a query's last progress: once per batch, never for an idle trigger."""

from spark_streaming.progress import trigger_phases

PROGRESS = {
    "batchId": 4,
    "numInputRows": 12,
    "durationMs": {"addBatch": 125, "latestOffset": 32, "triggerExecution": 276},
}


def test_a_batchs_phases_in_seconds_once() -> None:
    batch, phases = trigger_phases(PROGRESS, after=3)
    assert batch == 4
    assert phases == {"addBatch": 0.125, "latestOffset": 0.032, "triggerExecution": 0.276}
    assert trigger_phases(PROGRESS, after=batch) == (4, {})  # already heard


def test_no_progress_and_idle_triggers_give_nothing() -> None:
    assert trigger_phases(None, after=-1) == (-1, {})
    idle = {"batchId": 5, "durationMs": {"latestOffset": 30, "triggerExecution": 31}}
    assert trigger_phases(idle, after=4) == (4, {})
