"""What became of each command an entry point ran, for whoever counts them (the metrics of
``tributary run commands`` and ``tributary serve``): the outcome, how long it took, and the
optimistic-concurrency conflicts it met on the way."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["CommandObserver", "CommandOutcome", "Outcome"]

Outcome = Literal["accepted", "rejected", "conflicting"]
"""``accepted``: events appended (or the first result of a known command id); ``rejected``:
the domain or the data refused it; ``conflicting``: it lost the optimistic-concurrency race to
other writers more often than the bus retries (answered as a rejection)."""


@dataclass(frozen=True)
class CommandOutcome:
    """One command run by an entry point (``topic``: the command processor, ``http``)."""

    entry: str
    outcome: Outcome
    seconds: float
    conflicts: int = 0  # concurrency conflicts met, each retried with a fresh load


CommandObserver = Callable[[CommandOutcome], None]
