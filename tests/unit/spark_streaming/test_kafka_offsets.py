"""Micro-batch planning of the Kafka source (pure functions)."""

import pytest

from spark_streaming.errors import DataLossError
from spark_streaming.kafka_offsets import (
    OffsetRange,
    check_data_loss,
    plan_end,
    plan_ranges,
)
from spark_streaming.kafka_options import EARLIEST


def test_without_a_limit_the_end_is_the_latest() -> None:
    assert plan_end({"t": {"0": 3}}, {("t", 0): 10, ("t", 1): 4}, None) == {"t": {"0": 10, "1": 4}}


def test_a_limit_is_shared_by_lag_and_sums_to_the_limit() -> None:
    end = plan_end(
        {"t": {"0": 0, "1": 0, "2": 0}}, {("t", 0): 900, ("t", 1): 90, ("t", 2): 10}, 100
    )
    assert sum(end["t"].values()) == 100
    assert end["t"]["0"] >= 80 and end["t"]["2"] >= 1  # no partition starves


def test_a_limit_above_the_lag_reads_everything() -> None:
    assert plan_end({"t": {"0": 5}}, {("t", 0): 8}, 100) == {"t": {"0": 8}}


def test_repeated_limited_plans_reach_the_end() -> None:
    start = {"t": {"0": 0, "1": 0}}
    latest = {("t", 0): 1234, ("t", 1): 7}
    for _ in range(20):
        start = plan_end(start, latest, 100)
    assert start == {"t": {"0": 1234, "1": 7}}


def test_ranges_skip_empty_partitions_and_read_new_ones_from_earliest() -> None:
    ranges = plan_ranges({"t": {"0": 5, "1": 7}}, {"t": {"0": 9, "1": 7, "2": 4}}, True)
    assert ranges == [OffsetRange("t", 0, 5, 9), OffsetRange("t", 2, EARLIEST, 4)]


def test_an_end_below_the_start_is_data_loss_unless_allowed() -> None:
    with pytest.raises(DataLossError, match="failOnDataLoss=false"):
        plan_ranges({"t": {"0": 50}}, {"t": {"0": 10}}, True)
    assert plan_ranges({"t": {"0": 50}}, {"t": {"0": 10}}, False) == [
        OffsetRange("t", 0, EARLIEST, 10)
    ]


def test_data_loss_is_named_per_partition() -> None:
    problems = check_data_loss(
        {"t": {"0": 3, "1": 50, "2": 5}, "gone": {"0": 1}},
        lows={("t", 0): 10, ("t", 1): 0, ("t", 2): 0},
        highs={("t", 0): 20, ("t", 1): 10, ("t", 2): 5},
    )
    assert len(problems) == 3
    assert "gone[0] no longer exists" in problems[0]
    assert "offsets 3..9 were deleted" in problems[1]
    assert "t[1] ends at 10" in problems[2]
