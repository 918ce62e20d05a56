"""Metrics of the commands an entry point ran (the processor: ``topic``; ``serve``:
``http``), from :class:`event_store.outcomes.CommandOutcome`."""

from prometheus_client import CollectorRegistry

from event_store.outcomes import CommandOutcome
from infra.telemetry.families import Family

__all__ = ["COMMAND_BUCKETS_S", "OUTCOMES", "CommandMetrics"]

COMMAND_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
OUTCOMES = ("accepted", "rejected", "conflicting")
COMMANDS = Family(
    "counter",
    "tributary_commands",
    "Commands run, by entry point and outcome (accepted, rejected, conflicting: lost"
    " the optimistic-concurrency race more often than the bus retries).",
    ("entry", "outcome"),
)
DURATION = Family(
    "histogram",
    "tributary_command_duration_seconds",
    "Time to run a command through the command bus, by entry point and outcome.",
    ("entry", "outcome"),
    COMMAND_BUCKETS_S,
)
CONFLICTS = Family(
    "counter",
    "tributary_command_conflicts",
    "Optimistic-concurrency conflicts commands met (each retried with a fresh load).",
    ("entry",),
)


class CommandMetrics:
    """``tributary_commands_total``, ``tributary_command_duration_seconds`` and
    ``tributary_command_conflicts_total`` of one entry point."""

    def __init__(self, registry: CollectorRegistry, entry: str) -> None:
        self.entry = entry
        self.commands = COMMANDS.counter(registry)
        self.duration = DURATION.histogram(registry)
        self.conflicts = CONFLICTS.counter(registry)
        for outcome in OUTCOMES:  # every series exists from the start, at 0
            self.commands.labels(entry, outcome)
        self.conflicts.labels(entry)

    def observe(self, outcome: CommandOutcome) -> None:
        """Count one command (the processor's or the gateway's ``observer``)."""
        self.commands.labels(outcome.entry, outcome.outcome).inc()
        self.duration.labels(outcome.entry, outcome.outcome).observe(outcome.seconds)
        if outcome.conflicts:
            self.conflicts.labels(outcome.entry).inc(outcome.conflicts)
