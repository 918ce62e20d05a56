"""Thin, typed wrappers over confluent-kafka.

The names below are loaded on first use (PEP 562), so a module that needs only
:class:`KafkaConfig` (the settings, the CLI) does not pay for confluent-kafka's import.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from connectors.kafka.admin import PartitionInfo, TopicAdmin, TopicInfo
    from connectors.kafka.config import KafkaConfig
    from connectors.kafka.topics import CleanupPolicy, TopicSpec, history_topic, state_topic

__all__ = [
    "CleanupPolicy",
    "KafkaConfig",
    "PartitionInfo",
    "TopicAdmin",
    "TopicInfo",
    "TopicSpec",
    "history_topic",
    "state_topic",
]

_HOMES = {
    "PartitionInfo": "admin",
    "TopicAdmin": "admin",
    "TopicInfo": "admin",
    "KafkaConfig": "config",
    "CleanupPolicy": "topics",
    "TopicSpec": "topics",
    "history_topic": "topics",
    "state_topic": "topics",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
