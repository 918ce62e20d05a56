"""The sessions job's vectorised step: the same sessions as the plain merge of every event, in
one batch or many, with merges published and absorbed sessions deleted."""

import random

import pandas as pd
import pytest

from examples.social.analytics.sessions import (
    GAP_MS,
    SESSION_COLUMNS,
    merge_sessions,
    sessions_step,
)


def events(rows: list[tuple[int, int, str]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["user_id", "corrected_time", "kind"])


def empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="int64") for c in SESSION_COLUMNS})


def run(batches: list[list[tuple[int, int, str]]]) -> tuple[dict, list[tuple[int, int]]]:
    """Feed batches; the sessions published last per (user, start) minus the deleted ones."""
    state, held, deleted = empty(), {}, []
    for batch in batches:
        state, changed, absorbed = sessions_step(state, events(batch), GAP_MS, watermark=0)
        for row in changed.itertuples(index=False):
            held[(row.user_id, row.start)] = (row.last, row.events, row.searches, row.clicks)
        for row in absorbed.itertuples(index=False):
            held.pop((row.user_id, row.start), None)
            deleted.append((row.user_id, row.start))
    return held, deleted


def reference(rows: list[tuple[int, int, str]]) -> dict:
    out = {}
    for user in {r[0] for r in rows}:
        items = [(t, t, 1, int(k == "search"), int(k != "search")) for u, t, k in rows if u == user]
        for start, last, n, s, c in merge_sessions(items):
            out[(user, start)] = (last, n, s, c)
    return out


MINUTE = 60_000
WORKLOAD = [
    (1, 0, "search"),
    (1, 10 * MINUTE, "click"),
    (1, 50 * MINUTE, "search"),  # a second session of user 1 (40 minutes later)
    (2, 5 * MINUTE, "search"),
    (1, 30 * MINUTE, "click"),  # late: bridges user 1's two sessions into one
    (2, 100 * MINUTE, "click"),
]


def test_a_late_event_bridges_two_sessions_and_the_absorbed_one_is_deleted() -> None:
    held, deleted = run([WORKLOAD[:4], WORKLOAD[4:]])
    assert held == reference(WORKLOAD)
    assert held[(1, 0)] == (50 * MINUTE, 4, 2, 2)
    assert deleted == [(1, 50 * MINUTE)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_any_batching_gives_the_plain_merge(seed: int) -> None:
    rng = random.Random(seed)
    rows = [
        (rng.randrange(1, 20), rng.randrange(0, 600 * MINUTE), rng.choice(["search", "click"]))
        for _ in range(400)
    ]
    cuts = sorted(rng.sample(range(1, len(rows)), 7))
    batches = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(rows)], strict=True)]
    assert run(batches)[0] == reference(rows) == run([rows])[0]


def test_sessions_the_watermark_passed_leave_the_state() -> None:
    state, _, _ = sessions_step(empty(), events(WORKLOAD[:4]), GAP_MS, watermark=0)
    assert len(state) == 3
    later, _, _ = sessions_step(state, events([(3, 0, "search")]), GAP_MS, watermark=45 * MINUTE)
    # user 1's first (last event at 10 min) and user 2's (5 min) are final; user 3's too
    assert sorted(zip(later["user_id"], later["start"], strict=True)) == [(1, 50 * MINUTE)]
