"""The session stack's services answer real requests with the settings Tributary needs."""

import psycopg
import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition

from connectors.kafka import TopicAdmin, history_topic
from tests.integration.conftest import Endpoints


def test_postgres_has_logical_decoding(stack: Endpoints) -> None:
    with psycopg.connect(stack.postgres_dsn) as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                (["wal_level", "max_replication_slots", "max_wal_senders"],),
            ).fetchall()
        )
    assert settings["wal_level"] == "logical"
    assert int(settings["max_replication_slots"]) >= 4
    assert int(settings["max_wal_senders"]) >= 4


def test_redis_answers(stack: Endpoints) -> None:
    client = redis.Redis.from_url(stack.redis_url)
    client.set("tributary-test", "1")
    assert client.get("tributary-test") == b"1"


def _read_all(
    bootstrap: str, topic: str, partitions: int, expected: int
) -> list[tuple[int, bytes, bytes]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[tuple[int, bytes, bytes]] = []
    try:
        while len(out) < expected:
            batch = consumer.consume(expected - len(out), timeout=10)
            if not batch:
                break
            for msg in batch:
                assert msg.error() is None, msg.error()
                out.append((msg.partition(), msg.key(), msg.value()))
    finally:
        consumer.close()
    return out


def test_topic_survives_a_broker_restart(s3_stack: Endpoints, unique: str) -> None:
    if s3_stack.local is None:
        pytest.skip("the broker is external to this session: it cannot be restarted from here")
    topic = f"durable-{unique}"
    TopicAdmin(s3_stack.kafka).ensure(history_topic(topic, partitions=3))
    producer = Producer(
        {"bootstrap.servers": s3_stack.bootstrap_servers, "enable.idempotence": True}
    )
    sent = [(i % 3, f"k{i}".encode(), f"value-{i}".encode()) for i in range(5000)]
    for partition, key, value in sent:
        producer.produce(topic, key=key, value=value, partition=partition)
        if partition == 0 and int(key[1:]) % 999 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0

    old_pid = s3_stack.local.broker.pid()
    s3_stack.local.restart("broker")
    assert s3_stack.local.broker.pid() not in (None, old_pid)

    received = _read_all(s3_stack.bootstrap_servers, topic, 3, len(sent))
    assert sorted(received) == sorted(sent)
    for p in range(3):
        in_partition = [v for part, _, v in received if part == p]
        assert in_partition == [v for part, _, v in sent if part == p]
