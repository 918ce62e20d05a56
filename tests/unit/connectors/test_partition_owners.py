"""An owner's loop that stops polling counts as hung after the max poll interval (Kafka's
``max.poll.interval.ms``); the heartbeat then renews nothing (tested against PostgreSQL in
``tests/integration/event_store/test_command_processors.py``)."""

import pytest

from connectors.partition_owners import Ownership


def test_a_loop_that_stops_polling_is_hung_after_the_interval_and_not_once_it_polls() -> None:
    owner = Ownership("postgresql://unused", "g", 4, 1.0, max_poll_interval_s=60.0)
    assert not owner.hung()
    owner._polled_at -= 61.0  # as if it had not polled for longer than the interval
    assert owner.hung()
    owner.polled()
    assert not owner.hung()


def test_without_an_interval_a_loop_is_never_hung() -> None:
    owner = Ownership("postgresql://unused", "g", 4, 1.0)
    owner._polled_at -= 10_000  # as if it had not polled for hours
    assert not owner.hung()


@pytest.mark.parametrize("interval", [0.0, -1.0])
def test_an_interval_must_be_positive(interval: float) -> None:
    with pytest.raises(ValueError, match="max_poll_interval_s must be > 0"):
        Ownership("postgresql://unused", "g", 4, 1.0, max_poll_interval_s=interval)
