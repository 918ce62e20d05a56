"""Topic administration against the real broker."""

import json
import subprocess
import sys

import pytest
from confluent_kafka import Producer

from connectors.errors import TopicConfigMismatchError
from connectors.kafka import TopicAdmin, history_topic, state_topic
from tests.integration.conftest import Endpoints


def test_ensure_creates_with_policy_then_accepts_the_same_spec(
    stack: Endpoints, unique: str
) -> None:
    admin = TopicAdmin(stack.kafka)
    spec = state_topic(f"cdc.public.t{unique}", partitions=2)
    assert admin.ensure(spec) is True
    assert admin.ensure(spec) is False
    assert admin.configs(spec.name)["cleanup.policy"] == "compact"
    history = history_topic(f"events.t{unique}")
    admin.ensure(history)
    configs = admin.configs(history.name)
    assert configs["cleanup.policy"] == "delete"
    assert configs["retention.ms"] == "-1"


def test_ensure_names_every_difference(stack: Endpoints, unique: str) -> None:
    admin = TopicAdmin(stack.kafka)
    name = f"mismatch-{unique}"
    admin.ensure(history_topic(name, partitions=2))
    with pytest.raises(TopicConfigMismatchError) as err:
        admin.ensure(state_topic(name, partitions=3))
    assert "partitions is 2, expected 3" in str(err.value)
    assert "cleanup.policy is 'delete', expected 'compact'" in str(err.value)


def test_ensure_does_not_create_topics_by_asking_about_them(stack: Endpoints, unique: str) -> None:
    admin = TopicAdmin(stack.kafka)
    assert admin.partition_count(f"absent-{unique}") is None
    assert f"absent-{unique}" not in admin.topic_names()


def test_end_offsets_are_true_even_when_list_offsets_under_reports(
    stack: Endpoints, unique: str
) -> None:
    admin = TopicAdmin(stack.kafka)
    name = f"ends-{unique}"
    admin.ensure(history_topic(name, partitions=3))
    producer = Producer(stack.kafka.client_properties(**{"linger.ms": 50}))
    counts = {0: 1234, 1: 1, 2: 0}
    for partition, n in counts.items():
        for i in range(n):
            producer.produce(name, value=b"x" * 100, partition=partition)
            if i % 500 == 0:
                producer.flush()  # several batches per partition
    assert producer.flush(30) == 0
    assert admin.end_offsets(name) == counts


def test_topics_cli_json(stack: Endpoints, unique: str) -> None:
    admin = TopicAdmin(stack.kafka)
    name = f"cli-{unique}"
    admin.ensure(state_topic(name, partitions=2))
    producer = Producer(stack.kafka.client_properties())
    for i in range(10):
        producer.produce(name, key=str(i).encode(), value=b"v", partition=i % 2)
    producer.flush(10)
    env = {
        "PATH": "/usr/bin:/bin",
        "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        **stack.settings.kafka_security_env(),  # SASL/TLS of a brought Kafka
    }
    out = subprocess.run(
        [sys.executable, "-m", "infra.cli", "topics", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    [row] = [t for t in json.loads(out) if t["name"] == name]
    assert row == {
        "name": name,
        "partitions": 2,
        "cleanup_policy": "compact",
        "end_offsets": {"0": 5, "1": 5},
        "start_offsets": {"0": 0, "1": 0},
    }
