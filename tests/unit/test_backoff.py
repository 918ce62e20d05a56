"""The restart policy of the supervisor and the view runner."""

from tributary.backoff import Backoff


def test_the_delay_doubles_up_to_the_ceiling() -> None:
    backoff = Backoff(initial_s=1.0, max_s=30.0, stable_after_s=60.0)
    assert [backoff.next_delay(0.5) for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]


def test_a_part_that_stayed_up_starts_over() -> None:
    backoff = Backoff(initial_s=0.5, max_s=8.0, stable_after_s=60.0)
    assert [backoff.next_delay(1.0) for _ in range(3)] == [0.5, 1.0, 2.0]
    assert backoff.next_delay(59.9) == 4.0  # not long enough
    assert backoff.next_delay(60.0) == 0.5
    assert backoff.next_delay(0.0) == 1.0
