"""The registry reader's fetch-wait rules (``connectors.schema_registry.store.TailWait``)."""

from connectors.kafka.fetching import FETCH_WAITS_MS
from connectors.schema_registry.store import (
    IDLE_AFTER_S,
    IDLE_FETCH_WAIT_MS,
    STEP_DOWN_AFTER_S,
    TAIL_FETCH_WAIT_MS,
    TailWait,
)


def test_a_writer_waiting_while_fetches_bring_nothing_lengthens_the_wait() -> None:
    tail = TailWait(TAIL_FETCH_WAIT_MS, now=0.0)
    assert tail.seen(0.5, waiting=True, records=False) is None  # not stalled yet
    assert tail.seen(1.5, waiting=True, records=False) == FETCH_WAITS_MS[0]
    assert (tail.writers_ms, tail.reading_ms) == (FETCH_WAITS_MS[0], FETCH_WAITS_MS[0])
    assert tail.seen(1.6, waiting=True, records=True) is None  # records come: kept


def test_a_lengthened_wait_steps_down_only_after_the_hold_and_while_no_writer_waits() -> None:
    tail = TailWait(2_000, now=0.0)
    assert tail.seen(STEP_DOWN_AFTER_S / 2, waiting=False, records=False) is None
    assert tail.seen(STEP_DOWN_AFTER_S + 1, waiting=True, records=True) is None  # one waits
    assert tail.seen(STEP_DOWN_AFTER_S + 2, waiting=False, records=False) == 500
    assert tail.seen(STEP_DOWN_AFTER_S + 3, waiting=False, records=False) is None  # a new hold


def test_an_idle_reader_takes_the_long_wait_and_a_writer_wakes_it() -> None:
    tail = TailWait(TAIL_FETCH_WAIT_MS, now=0.0)
    assert tail.seen(IDLE_AFTER_S / 2, waiting=False, records=False) is None
    assert tail.seen(IDLE_AFTER_S + 1, waiting=False, records=False) == IDLE_FETCH_WAIT_MS
    assert tail.idle and tail.writers_ms == TAIL_FETCH_WAIT_MS
    assert tail.seen(IDLE_AFTER_S + 60, waiting=False, records=True) is None  # others' writes
    assert tail.seen(IDLE_AFTER_S + 61, waiting=True, records=False) == TAIL_FETCH_WAIT_MS
    assert not tail.idle and tail.reading_ms == TAIL_FETCH_WAIT_MS
    # no stall is counted from the idle wait: the writer gets the short wait's allowance
    assert tail.seen(IDLE_AFTER_S + 61.5, waiting=True, records=False) is None


def test_an_idle_reader_steps_the_writers_wait_down_without_reopening() -> None:
    tail = TailWait(100, now=0.0)
    assert tail.seen(IDLE_AFTER_S + 1, waiting=False, records=False) == IDLE_FETCH_WAIT_MS
    assert tail.seen(STEP_DOWN_AFTER_S + 1, waiting=False, records=False) is None
    assert (tail.writers_ms, tail.reading_ms) == (TAIL_FETCH_WAIT_MS, IDLE_FETCH_WAIT_MS)
