"""The CDC publisher records where each stream's latest event landed on Kafka, in the event
store's ``published_streams``, before the engine commits the batch."""

import random
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from cdc.errors import PublishError
from cdc.published import PublishedStreams
from cdc.publisher import ChangePublisher, OutgoingChange, PublishedEvent, StreamVersion
from connectors.kafka import TopicAdmin
from connectors.postgres import PostgresConfig
from event_store import Accepted, CommandBus
from tests.integration.cdc_process import CdcProcess
from tests.integration.conftest import Endpoints
from tests.integration.event_store.conftest import StoreEnv, role_url
from tests.integration.kafka_reading import read_topic, wait_until

Factory = Callable[..., CdcProcess]


def _send(bus: CommandBus, command_type: str, **data: Any) -> Accepted:
    result = bus.send(bus.registry.decode(command_type, data))
    assert isinstance(result, Accepted), result
    return result


def _rows(stack: Endpoints, schema: str) -> dict[str, tuple[Any, ...]]:
    with psycopg.connect(stack.postgres_dsn) as conn:
        rows = conn.execute(
            f'SELECT stream_id, stream_type, version, topic, partition, "offset", published_at'  # type: ignore[arg-type]
            f" FROM {schema}.published_streams"
        ).fetchall()
    return {r[0]: r[1:] for r in rows}


def test_the_connector_records_each_streams_latest_topic_partition_and_offset(
    stack: Endpoints, env: StoreEnv, connector_factory: Factory
) -> None:
    bus = env.bus()
    first, second = random.sample(range(10**6, 10**7), 2)
    created = _send(bus, "CreatePost", post_id=first, author_id=1, text="one")
    _send(bus, "EditPost", post_id=first, text="two")
    edited = _send(bus, "EditPost", post_id=first, text="three")
    other = _send(bus, "CreatePost", post_id=second, author_id=2, text="other")
    follow = _send(bus, "FollowUser", follower_id=3, followee_id=4)
    latest = {r.stream_id: r for r in (edited, other, follow)}

    connector = connector_factory(
        [f"{env.schema}.events"], cdc_outbox_table=f"{env.schema}.events", cdc_schema_wait_s="2"
    )
    connector.start()  # the snapshot reads these events ('r'), then streaming goes on

    def recorded(results: dict[str, Accepted]) -> bool:
        rows = _rows(stack, env.schema)
        return all(s in rows and rows[s][1] == r.version for s, r in results.items())

    wait_until(lambda: recorded(latest), 120, "published_streams after the snapshot")
    assert created.version == 1 and edited.version == 3
    _check_against_the_topics(stack, env, latest)

    # Streaming: a new version moves the row forward to the new record.
    before = _rows(stack, env.schema)[edited.stream_id]
    again = _send(bus, "EditPost", post_id=first, text="four")
    wait_until(lambda: recorded({again.stream_id: again}), 60, "the streamed version")
    after = _rows(stack, env.schema)[again.stream_id]
    assert after[1] == 4 and after[4] > before[4] and after[5] >= before[5]
    _check_against_the_topics(stack, env, {again.stream_id: again})

    # The table is not captured: the publication holds only the configured tables.
    with psycopg.connect(stack.postgres_dsn) as conn:
        published = {
            f"{r[0]}.{r[1]}"
            for r in conn.execute(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                (f"tributary_{connector.name}",),
            )
        }
    assert f"{env.schema}.events" in published
    assert f"{env.schema}.published_streams" not in published
    assert f"cdc.{env.schema}.published_streams" not in TopicAdmin(stack.kafka).topic_names()
    assert connector.status()["record_seconds"] > 0  # type: ignore[operator]


def _check_against_the_topics(
    stack: Endpoints, env: StoreEnv, results: dict[str, Accepted]
) -> None:
    """Each row names the partition and offset of the record carrying the stream's last event."""
    rows = _rows(stack, env.schema)
    for stream_id, result in results.items():
        stream_type, version, topic, partition, offset, published_at = rows[stream_id]
        assert (stream_type, version, topic) == (
            result.stream_type,
            result.version,
            f"events.{result.stream_type}",
        )
        assert published_at is not None
        last_event = result.event_ids[-1].encode()
        [record] = [
            r for r in read_topic(stack.kafka, topic) if r.headers["event_id"] == last_event
        ]
        assert (record.partition, record.offset) == (partition, offset)
        assert record.key == stream_id.encode()
        assert record.headers["version"] == str(version).encode()


def _event(stream_id: str, version: int, offset: int) -> PublishedEvent:
    return PublishedEvent(StreamVersion(stream_id, "post", version), "events.post", 0, offset)


def test_a_row_only_moves_forward_and_the_application_role_may_write_it(
    stack: Endpoints, env: StoreEnv
) -> None:
    app_db = PostgresConfig(role_url(stack.database_url, env.role))
    recorder = PublishedStreams(app_db, env.schema)
    try:
        recorder.check()
        recorder.record([_event("post-1", 3, 30), _event("post-2", 1, 31)])
        recorder.record([_event("post-1", 2, 40)])  # an older version, re-published: ignored
        recorder.record([_event("post-1", 3, 50)])  # the same version again: the first stays
        assert _rows(stack, env.schema)["post-1"][1:5] == (3, "events.post", 0, 30)
        recorder.record([_event("post-1", 4, 60), _event("post-2", 2, 61)])
        rows = _rows(stack, env.schema)
        assert rows["post-1"][1:5] == (4, "events.post", 0, 60)
        assert rows["post-2"][1:5] == (2, "events.post", 0, 61)
    finally:
        recorder.close()


def test_a_failure_to_record_fails_the_batch_like_a_produce_failure(
    stack: Endpoints, unique: str
) -> None:
    recorder = PublishedStreams(PostgresConfig(stack.database_url), f"missing_{unique}")
    publisher = ChangePublisher(stack.kafka, on_published=recorder.record)
    change = OutgoingChange(
        f"ryw-{unique}", b"post-1", b"v", [], StreamVersion("post-1", "post", 1)
    )
    try:
        with pytest.raises(PublishError, match=f"missing_{unique}.published_streams"):
            publisher.publish([change])
        assert publisher.publish([OutgoingChange(f"ryw-{unique}", b"k", b"v", [])]) == 1
    finally:
        publisher.close()
        recorder.close()
        TopicAdmin(stack.kafka).delete(f"ryw-{unique}")


def test_the_connector_refuses_to_start_without_the_table(
    stack: Endpoints, env: StoreEnv, connector_factory: Factory
) -> None:
    with env.admin.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {env.schema}.published_streams")
    connector = connector_factory(
        [f"{env.schema}.events"], cdc_outbox_table=f"{env.schema}.events", cdc_schema_wait_s="2"
    )
    connector.start()
    assert connector.wait_exit(120) == 1
    assert "published_streams does not exist" in connector.output()
    assert "create_schema" in connector.output()
