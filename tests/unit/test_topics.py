import pytest

from connectors.kafka import KafkaConfig, TopicSpec, history_topic, state_topic


def test_state_topics_are_compacted() -> None:
    spec = state_topic("cdc.public.users", partitions=3)
    assert spec.topic_configs() == {"cleanup.policy": "compact"}
    assert spec.partitions == 3


def test_history_topics_are_never_compacted_and_kept_forever() -> None:
    assert history_topic("events.post").topic_configs() == {
        "cleanup.policy": "delete",
        "retention.ms": "-1",
    }


def test_spec_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="partitions"):
        TopicSpec("x", partitions=0)
    with pytest.raises(ValueError, match="name"):
        TopicSpec("")


def test_client_properties_layering() -> None:
    config = KafkaConfig("b:9092", client_id="c", extra={"security.protocol": "SSL"})
    props = config.client_properties(**{"group.id": "g"})
    assert props == {
        "bootstrap.servers": "b:9092",
        "client.id": "c",
        "security.protocol": "SSL",
        "group.id": "g",
    }
