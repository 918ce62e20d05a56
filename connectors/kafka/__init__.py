"""Thin, typed wrappers over confluent-kafka."""

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
