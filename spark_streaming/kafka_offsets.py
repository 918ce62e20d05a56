"""Offsets of the Kafka source and how a micro-batch's range is planned (pure functions).

Offsets are ``{"topic": {"partition": next_offset}}``, the JSON Spark's Kafka connector keeps in
the checkpoint. A partition the source has not seen before starts at the earliest offset still on
the broker (:data:`EARLIEST`), as in Spark's connector.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from spark_streaming.errors import DataLossError
from spark_streaming.kafka_options import EARLIEST

Offsets = dict[str, dict[str, int]]
TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True)
class OffsetRange:
    """Records ``[start, end)`` of one partition; ``start`` may be :data:`EARLIEST`."""

    topic: str
    partition: int
    start: int
    end: int


def flatten(offsets: Mapping[str, Mapping[str, int]]) -> dict[TopicPartitionKey, int]:
    return {(t, int(p)): o for t, parts in offsets.items() for p, o in parts.items()}


def nest(flat: Mapping[TopicPartitionKey, int]) -> Offsets:
    out: Offsets = {}
    for (topic, partition), offset in sorted(flat.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def check_data_loss(
    start: Mapping[str, Mapping[str, int]],
    lows: Mapping[TopicPartitionKey, int],
    highs: Mapping[TopicPartitionKey, int],
) -> list[str]:
    """What the broker lost of the offsets ``start`` still needs, one sentence per partition."""
    problems = []
    for (topic, partition), offset in sorted(flatten(start).items()):
        tp = f"{topic}[{partition}]"
        if (topic, partition) not in highs:
            problems.append(f"{tp} no longer exists (topic or partition deleted)")
        elif offset > highs[(topic, partition)]:
            problems.append(
                f"{tp} ends at {highs[(topic, partition)]} but the query already read up to"
                f" {offset} (was the topic recreated?)"
            )
        elif offset >= 0 and offset < lows[(topic, partition)]:
            problems.append(
                f"{tp} starts at {lows[(topic, partition)]}; offsets {offset}.."
                f"{lows[(topic, partition)] - 1} were deleted before they were read"
            )
    return problems


def data_loss_error(problems: list[str]) -> DataLossError:
    return DataLossError(
        "Kafka source lost data: "
        + "; ".join(problems)
        + ". Set the option failOnDataLoss=false to skip the lost range and go on."
    )


def plan_end(
    start: Mapping[str, Mapping[str, int]],
    latest: Mapping[TopicPartitionKey, int],
    max_records: int | None,
) -> Offsets:
    """The end of the next batch: ``latest``, or at most ``max_records`` offsets past ``start``
    shared across partitions in proportion to their lag (each lagging partition gets at least
    one while the budget lasts, so none starves)."""
    begin = flatten(start)
    end = dict(begin)  # a partition that vanished keeps its offset (data loss is checked apart)
    lags: dict[TopicPartitionKey, int] = {}
    for tp, high in latest.items():
        if tp in begin and high < begin[tp]:
            end[tp] = high  # the log went back (recreated topic): follow it
        else:
            lags[tp] = max(0, high - max(begin.get(tp, 0), 0))
    if max_records is None or sum(lags.values()) <= max_records:
        end.update({tp: latest[tp] for tp in lags})
        return nest(end)
    total = sum(lags.values())
    grant = {tp: max_records * lag // total for tp, lag in lags.items()}
    left = max_records - sum(grant.values())
    for tp in sorted(lags, key=lambda k: (grant[k] - lags[k], k)):
        if left <= 0:
            break
        if lags[tp] > grant[tp]:
            grant[tp] += 1
            left -= 1
    for tp, amount in grant.items():
        if tp in begin or amount > 0:
            end[tp] = max(begin.get(tp, 0), 0) + amount
    return nest(end)


def plan_ranges(
    start: Mapping[str, Mapping[str, int]],
    end: Mapping[str, Mapping[str, int]],
    fail_on_data_loss: bool,
) -> list[OffsetRange]:
    """The ranges between two offsets, one per partition with something to read.

    A partition missing from ``start`` is new: it is read from the earliest offset. An end below
    its start means the topic was recreated: an error, or (``fail_on_data_loss`` false) a read
    of the new log from its beginning.
    """
    begin = flatten(start)
    ranges = []
    for (topic, partition), stop in sorted(flatten(end).items()):
        first = begin.get((topic, partition), EARLIEST)
        if stop < first:
            if fail_on_data_loss:
                raise data_loss_error(
                    [f"{topic}[{partition}] went back from {first} to {stop} (topic recreated?)"]
                )
            first = EARLIEST
        if stop > max(first, 0) or (first == EARLIEST and stop > 0):
            ranges.append(OffsetRange(topic, partition, first, stop))
    return ranges
