"""A rebuild whose query could not start Spark's Python process in time starts again; any
other failure ends the rebuild at once."""

from types import SimpleNamespace
from typing import Any

import pytest

from spark_streaming import replay as replay_module
from spark_streaming.errors import ReplayError
from spark_streaming.replay import REBUILD_ATTEMPTS, ReplayResult, replay

SPEC = SimpleNamespace(name="v")
MISSED = (
    "rebuild of v failed, the live view is unchanged: [STREAM_FAILED] Query terminated with"
    " exception: Python worker failed to connect back. SQLSTATE: XXKST"
)


def attempts(monkeypatch: pytest.MonkeyPatch, failures: list[str]) -> list[int]:
    calls: list[int] = []

    def once(*_args: Any, **_kwargs: Any) -> ReplayResult:
        calls.append(1)
        if failures:
            raise ReplayError(failures.pop(0))
        return ReplayResult("v", "g2", "g1", 10, 1)

    monkeypatch.setattr(replay_module, "_replay_once", once)
    monkeypatch.setattr("spark_streaming.replay.time.sleep", lambda _s: None)
    return calls


def test_a_worker_that_missed_its_start_costs_a_new_rebuild(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = attempts(monkeypatch, [MISSED, MISSED])
    result = replay(None, SPEC, None, None)  # type: ignore[arg-type]
    assert (result.generation, len(calls)) == ("g2", 3)


def test_the_attempts_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = attempts(monkeypatch, [MISSED] * (REBUILD_ATTEMPTS + 1))
    with pytest.raises(ReplayError, match="connect back"):
        replay(None, SPEC, None, None)  # type: ignore[arg-type]
    assert len(calls) == REBUILD_ATTEMPTS


def test_any_other_failure_ends_the_rebuild_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = attempts(monkeypatch, ["rebuild of v failed: the store refused the batch", MISSED])
    with pytest.raises(ReplayError, match="refused"):
        replay(None, SPEC, None, None)  # type: ignore[arg-type]
    assert len(calls) == 1
