"""Cases measured in interleaved rounds (each case once per round, so a change of the
machine's load hits every case alike), reported as medians with their spread and as ratios:
of the medians, and the median of each round's own ratio (steadier when the load changes
between rounds)."""

import statistics
from collections.abc import Callable, Mapping

__all__ = ["Rounds"]


class Rounds:
    """The samples of each case (one per round), in the order the cases were given."""

    def __init__(self, runs: Mapping[str, Callable[[], float]]) -> None:
        self.runs = dict(runs)
        self.samples: dict[str, list[float]] = {label: [] for label in self.runs}

    def run(self, rounds: int) -> "Rounds":
        for r in range(rounds):
            for label, case in self.runs.items():
                self.samples[label].append(case())
            print(f"  round {r + 1}/{rounds} done", flush=True)
        return self

    def median(self, label: str) -> float:
        return statistics.median(self.samples[label])

    def print_rates(self, width: int) -> None:
        """Each case's median rate and, over several rounds, its lowest and highest."""
        for label, values in self.samples.items():
            spread = f"{min(values):>9,.0f} .. {max(values):>9,.0f}" if len(values) > 1 else ""
            print(f"  {label:<{width}} {self.median(label):>10,.0f} /s   {spread}")

    def ratio(self, a: str, b: str) -> tuple[float, float]:
        """``a / b``: of the medians, and the median of each round's own ratio."""
        own = statistics.median(
            x / y for x, y in zip(self.samples[a], self.samples[b], strict=True)
        )
        return self.median(a) / self.median(b), own
