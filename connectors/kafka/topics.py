"""Topic specifications: what a topic must look like for Tributary to use it."""

from dataclasses import dataclass, field
from typing import Literal

CleanupPolicy = Literal["compact", "delete"]

RETAIN_FOREVER = -1


@dataclass(frozen=True)
class TopicSpec:
    """A topic's name, partition count and the configs Tributary relies on."""

    name: str
    partitions: int = 1
    cleanup_policy: CleanupPolicy = "delete"
    retention_ms: int | None = None
    configs: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a topic needs a name")
        if self.partitions < 1:
            raise ValueError(f"topic {self.name}: partitions must be >= 1, got {self.partitions}")

    def topic_configs(self) -> dict[str, str]:
        """The topic-level configs to create the topic with (and to check it against)."""
        out: dict[str, str] = {"cleanup.policy": self.cleanup_policy}
        if self.retention_ms is not None:
            out["retention.ms"] = str(self.retention_ms)
        out.update(self.configs)
        return out


def state_topic(name: str, partitions: int = 1) -> TopicSpec:
    """A state topic (latest value per key): compacted, so a delete's tombstone removes the key."""
    return TopicSpec(name=name, partitions=partitions, cleanup_policy="compact")


def history_topic(name: str, partitions: int = 1) -> TopicSpec:
    """A history topic (an event log): never compacted, kept forever."""
    return TopicSpec(
        name=name, partitions=partitions, cleanup_policy="delete", retention_ms=RETAIN_FOREVER
    )
