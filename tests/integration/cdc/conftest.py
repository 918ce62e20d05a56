"""Fixtures of the CDC tests: connectors the tests start, stop and kill, cleaned up after."""

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cdc.slots import drop_publication, drop_slot
from connectors.changes import ChangeEvent
from connectors.kafka import TopicAdmin
from connectors.postgres import PostgresConfig
from tests.integration.cdc_process import CdcProcess
from tests.integration.conftest import Endpoints
from tests.integration.kafka_reading import read_topic


@pytest.fixture
def connector_factory(stack: Endpoints, tmp_path: Path, unique: str) -> Iterator[object]:
    made: list[CdcProcess] = []

    def make(tables: list[str], **extra: str) -> CdcProcess:
        proc = CdcProcess(
            stack, tmp_path / f"cdc-{len(made)}", f"t{unique}_{len(made)}", tables, **extra
        )
        made.append(proc)
        return proc

    yield make
    db = PostgresConfig(stack.database_url)
    for proc in made:
        proc.stop()
        drop_slot(db, f"tributary_{proc.name}")
        drop_publication(db, f"tributary_{proc.name}")


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
