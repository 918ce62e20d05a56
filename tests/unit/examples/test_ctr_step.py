"""The click-through job's per-partition step (pure pandas): joins, expiry by the partition's
clock, count changes per query, and the same end state whether the records come in one batch
or many."""

import json
from typing import Any

import pandas as pd
import pytest

from examples.social.analytics.ctr import (
    SEARCH_COLUMNS,
    WAITING_COLUMNS,
    _empty,
    _frame_bytes,
    _frame_of,
    ctr_step,
)
from projections.time import HOUR_MS

ALLOWED = 300_000
CLOCK = 1_500 + HOUR_MS + ALLOWED + 10  # past s2's hour and allowance, not s4's


def record(kind: str, event_id: str, t: int, received: int, **kw: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        "kept": kw.pop("kept", True),
        "event_id": event_id,
        "session_id": kw.pop("session", "s-1"),
        "user_id": 7,
        "query": kw.pop("query", None),
        "search_id": kw.pop("search_id", None),
        "post_id": kw.pop("post_id", None),
        "corrected_time": t,
        "received_time": received,
    }


def run(batches: list[list[dict[str, Any]]]) -> tuple[dict[str, Any], dict[str, dict[str, int]]]:
    """Feed batches through the step (state round-tripped through bytes as the processor
    stores it); the last output per key and the summed count changes per query."""
    clock, searches, waiting = 0, _empty(SEARCH_COLUMNS), _empty(WAITING_COLUMNS)
    latest: dict[str, Any] = {}
    totals: dict[str, dict[str, int]] = {}
    for batch in batches:
        clock, searches, waiting, out, counts = ctr_step(
            0, clock, searches, waiting, pd.DataFrame(batch), ALLOWED
        )
        searches = _frame_of(_frame_bytes(searches), SEARCH_COLUMNS)
        waiting = _frame_of(_frame_bytes(waiting), WAITING_COLUMNS)
        for row in out:
            key = (row["collection"], row["key"])
            newer = key not in latest or latest[key][0] < row["position"]
            assert newer or row["collection"] == "clicks"
            latest[key] = (row["position"], json.loads(row["fields"]))
        for item in counts.to_dict("records"):
            entry = totals.setdefault(
                item["d_query"],
                dict.fromkeys(("d_searches", "d_clicked", "d_no_click", "d_open"), 0),
            )
            for name in entry:
                entry[name] += int(item[name])
    return {f"{c}/{k}": v[1] for (c, k), v in latest.items()}, totals


WORKLOAD = [
    record("search", "s1", 1_000, 1_000, query="kafka"),
    record("click", "c0", 1_500, 1_600, search_id="s3", post_id=9),  # before its search
    record("search", "s2", 1_500, 1_700, query="kafka"),
    record("search", "s3", 1_200, 1_800, query="spark"),
    record("click", "c1", 2_000, 2_100, search_id="s1", post_id=5),
    record("click", "c2", 3_000, 3_100, search_id="s1", post_id=6),
    record("click", "cx", 2_500, 2_600, search_id="s2", session="other", post_id=1),
    record("click", "c1", 2_000, 2_100, search_id="s1", post_id=5),  # re-delivered
    record("search", "s4", 10_000, 10_000, query="kafka", kept=False),  # beyond lateness
    # a click of another session moves the partition's clock past s1's to s3's expiry
    record("click", "tick", CLOCK, CLOCK, session="s-9", search_id="s-none", post_id=2),
]


def test_one_batch() -> None:
    held, totals = run([WORKLOAD])
    assert held["searches/s1"]["status"] == "clicked"
    assert held["searches/s1"]["clicks"] == 2
    assert held["searches/s1"]["first_click_ms"] == 2_000
    assert held["searches/s3"]["status"] == "clicked"  # the click that came first joined
    # s2: no click of its session; the clock passed its hour and the allowance
    assert held["searches/s2"]["status"] == "no_click"
    clicks = {v["click_id"]: v["delay_ms"] for k, v in held.items() if k.startswith("clicks/")}
    assert clicks == {"c0": 300, "c1": 1_000, "c2": 2_000}
    assert "searches/s4" not in held
    assert totals == {
        "kafka": {"d_searches": 2, "d_clicked": 1, "d_no_click": 1, "d_open": 0},
        "spark": {"d_searches": 1, "d_clicked": 1, "d_no_click": 0, "d_open": 0},
    }


@pytest.mark.parametrize("size", [1, 2, 3])
def test_many_batches_end_as_one(size: int) -> None:
    batches = [WORKLOAD[i : i + size] for i in range(0, len(WORKLOAD), size)]
    assert run(batches) == run([WORKLOAD])


def test_totals_per_query_add_up_the_changes_of_every_partition() -> None:
    from examples.social.analytics.ctr import TOTALS_COLUMNS, totals_step

    def deltas(rows: list[tuple[str, int, int, int, int]]) -> pd.DataFrame:
        names = ["d_query", "d_searches", "d_clicked", "d_no_click", "d_open"]
        return pd.DataFrame(rows, columns=names)

    empty = pd.DataFrame({c: pd.Series(dtype="int64") for c in TOTALS_COLUMNS})
    p0 = [("kafka", 1, 0, 0, 1), ("spark", 1, 0, 0, 1)]
    p1 = [("kafka", 1, 0, 0, 1), ("kafka", 0, 1, 0, -1), ("spark", 0, 0, 1, -1)]
    totals, changed = totals_step(empty, deltas(p0))
    assert set(changed["query"]) == {"kafka", "spark"} and set(changed["revision"]) == {1}
    totals, changed = totals_step(totals, deltas(p1))
    got = {r.query: (r.searches, r.clicked, r.no_click, r.open) for r in totals.itertuples()}
    assert got == {"kafka": (2, 1, 0, 1), "spark": (1, 0, 1, 0)}
    assert dict(zip(changed["query"], changed["revision"], strict=True)) == {"kafka": 2, "spark": 2}
    at_once, _ = totals_step(empty, deltas(p0 + p1))
    assert {
        r.query: (r.searches, r.clicked, r.no_click, r.open) for r in at_once.itertuples()
    } == got
