"""Restart with backoff, written once: the supervisor restarts a dead process and the view
runner a failed query with the same policy (README: 1 s doubling to 30 s, reset after a
minute up)."""

from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass
class Backoff:
    """The delays before each restart of one part: ``initial_s``, doubling up to ``max_s``;
    a part that stayed up ``stable_after_s`` starts over at ``initial_s``."""

    initial_s: float = 1.0
    max_s: float = 30.0
    stable_after_s: float = 60.0
    failures: int = 0

    def next_delay(self, up_for_s: float) -> float:
        """The delay before the next start of a part that failed after ``up_for_s`` seconds
        up (0 when it never came up)."""
        if up_for_s >= self.stable_after_s:
            self.failures = 0
        delay = min(self.max_s, self.initial_s * 2**self.failures)
        self.failures += 1
        return float(delay)
