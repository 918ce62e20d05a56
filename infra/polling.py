"""Waiting for a condition that another process makes true: poll it until it holds or the time
is up (the demo, the chaos harness and the integration tests wait this way)."""

import time
from collections.abc import Callable

from infra.errors import WaitTimeoutError

__all__ = ["Deadline", "WaitTimeoutError", "poll_until"]


def poll_until(
    check: Callable[[], object],
    timeout: float,
    what: str,
    every: float = 0.5,
    *,
    retry_on: tuple[type[BaseException], ...] = (),
) -> float:
    """Call ``check`` every ``every`` seconds until it returns something true; the seconds it
    took. An exception of a type in ``retry_on`` counts as "not yet" (the last one is chained
    to the timeout); any other exception, an ``AssertionError`` of the check included, ends
    the wait at once. :class:`WaitTimeoutError` naming ``what`` once ``timeout`` is up."""
    started = time.monotonic()
    deadline = started + timeout
    last: BaseException | None = None
    while True:
        try:
            if check():
                return time.monotonic() - started
        except retry_on as exc:
            last = exc
        if time.monotonic() >= deadline:
            because = f" (last: {type(last).__name__}: {last})" if last is not None else ""
            raise WaitTimeoutError(
                f"timed out after {timeout:.0f}s waiting for {what}{because}"
            ) from last
        time.sleep(min(every, max(deadline - time.monotonic(), 0.0)))


class Deadline:
    """One time budget shared by several waits: each takes what is left, at most its own
    bound, so the waits together never outlast the budget."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left(self, at_most: float = float("inf")) -> float:
        """Seconds left (0 when none), at most ``at_most``."""
        return max(0.0, min(at_most, self.at - time.monotonic()))
