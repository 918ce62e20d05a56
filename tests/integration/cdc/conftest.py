"""Helpers of the CDC tests: the records of a topic, decoded; SQL in autocommit."""

import psycopg

from connectors.kafka import TopicAdmin
from tests.integration.conftest import Endpoints
from tests.integration.kafka_reading import read_topic
from tributary.changes import ChangeEvent


def changes_on(stack: Endpoints, topic: str) -> list[ChangeEvent]:
    """Every record of a CDC topic, decoded."""
    return [
        ChangeEvent.from_kafka(topic, r.key, r.value, r.headers)
        for r in read_topic(stack.kafka, topic)
    ]


def topic_length(stack: Endpoints, topic: str) -> int:
    """Records on the topic now (0 while it does not exist)."""
    admin = TopicAdmin(stack.kafka)
    if topic not in admin.topic_names():
        return 0
    return sum(admin.end_offsets(topic).values())


def sql(stack: Endpoints, *statements: str) -> None:
    with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]
