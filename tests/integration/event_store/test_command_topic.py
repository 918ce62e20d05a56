"""End to end through Kafka: `commands` in, `command-results` out, events in the store."""

import json
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from connectors.kafka import TopicAdmin
from connectors.kafka.reading import read_topic
from event_store import Accepted, Rejected
from event_store.command_topic import (
    CommandClient,
    CommandProcessor,
    CommandTopics,
    ResultWaiter,
    ensure_topics,
)
from event_store.outcomes import CommandOutcome
from tests.integration.conftest import Endpoints
from tests.integration.event_store.conftest import StoreEnv


@pytest.fixture
def topics(stack: Endpoints, unique: str) -> Iterator[CommandTopics]:
    names = CommandTopics(f"commands-{unique}", f"command-results-{unique}", partitions=2)
    ensure_topics(stack.kafka, names)
    yield names
    TopicAdmin(stack.kafka).delete(names.commands, names.results)


def _start(processor: CommandProcessor) -> threading.Thread:
    thread = threading.Thread(target=processor.run, kwargs={"poll_timeout": 0.2}, daemon=True)
    thread.start()
    return thread


def process_until(processor: CommandProcessor, handled: int, attempts: int) -> int:
    """Run batches until ``handled`` commands were handled (or ``attempts`` batches ran)."""
    done = 0
    for _ in range(attempts):
        done += processor.process_batch(0.5)
        if done >= handled:
            break
    return done


def test_a_command_on_the_topic_yields_its_result(
    stack: Endpoints, env: StoreEnv, topics: CommandTopics, unique: str
) -> None:
    bus = env.bus()
    processor = CommandProcessor(bus, stack.kafka, topics, consumer_name=f"proc-{unique}")
    thread = _start(processor)
    client = CommandClient(stack.kafka, topics, registry=bus.registry)
    try:
        data = {"post_id": 1, "author_id": 1, "text": "over #kafka"}
        result = client.send_and_wait("CreatePost", data, command_id="k-1", timeout=60)
        assert isinstance(result, Accepted)
        assert (result.stream_id, result.version, result.command_id) == ("post-1", 1, "k-1")
        [event] = env.store.read_stream("post-1")
        assert [str(event.event_id)] == list(result.event_ids)
        assert event.data["hashtags"] == ["kafka"]

        invalid = client.send_and_wait("EditPost", {"post_id": 2, "text": "x"}, timeout=60)
        assert isinstance(invalid, Rejected) and "does not exist" in invalid.reason
        wrong = client.send_and_wait("CreatePost", {"post_id": "one"}, timeout=60)
        assert isinstance(wrong, Rejected) and "author_id" in wrong.reason
        again = client.send_and_wait("CreatePost", data, command_id="k-1", timeout=60)
        assert again == result
        assert env.count_events() == 1
    finally:
        processor.stop()
        thread.join(30)
    assert not thread.is_alive()


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"type": "CreatePost", "data": {}}', "command_id"),
        (None, "no value"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_malformed_messages_get_a_rejected_result_and_never_stop_the_processor(
    stack: Endpoints,
    env: StoreEnv,
    topics: CommandTopics,
    unique: str,
    value: bytes | None,
    reason: str,
) -> None:
    bus = env.bus()
    processor = CommandProcessor(bus, stack.kafka, topics, consumer_name=f"proc-{unique}")
    producer = Producer(stack.kafka.client_properties())
    waiter = ResultWaiter(stack.kafka, topics.results)
    bad_with_id = json.dumps({"command_id": "bad-1", "type": "CreatePost", "data": [1]}).encode()
    producer.produce(topics.commands, key=b"x", value=value)
    producer.produce(topics.commands, key=b"x", value=bad_with_id)
    assert producer.flush(30) == 0
    handled = process_until(processor, 2, 50)
    assert handled == 2
    assert env.count_events() == 0
    [keyless] = _results_without_key(stack, topics)
    assert keyless["status"] == "rejected" and reason in keyless["reason"]
    result = waiter.wait("bad-1", timeout=30)
    assert isinstance(result, Rejected) and "data must be a JSON object" in result.reason
    waiter.close()
    processor.close()


def _results_without_key(stack: Endpoints, topics: CommandTopics) -> list[dict[str, object]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        stack.kafka.client_properties(**{"group.id": "x", "enable.auto.commit": False})
    )
    consumer.assign([TopicPartition(topics.results, p, 0) for p in range(topics.partitions)])
    out = []
    try:
        for msg in consumer.consume(2, timeout=10):
            if msg.error() is None and msg.key() is None:
                out.append(json.loads(msg.value()))
    finally:
        consumer.close()
    return out


def test_a_restarted_processor_resumes_after_its_stored_offsets(
    stack: Endpoints, env: StoreEnv, topics: CommandTopics, unique: str
) -> None:
    bus = env.bus()
    client = CommandClient(stack.kafka, topics, registry=bus.registry)
    ids = [client.send("FollowUser", {"follower_id": 1, "followee_id": f}) for f in (2, 3)]
    first = CommandProcessor(bus, stack.kafka, topics, consumer_name=f"proc-{unique}")
    handled = process_until(first, 2, 50)
    first.close()
    assert handled == 2 and env.count_events() == 2

    later = client.send("FollowUser", {"follower_id": 1, "followee_id": 4})
    second = CommandProcessor(bus, stack.kafka, topics, consumer_name=f"proc-{unique}")
    handled = process_until(second, 1, 20)
    second.close()
    assert handled == 1, "the restarted processor re-read handled commands"
    assert env.count_events() == 3
    assert bus.previous_result(later) is not None
    assert all(isinstance(bus.previous_result(i), Accepted) for i in ids)
    assert uuid.UUID(later)


def test_a_processor_that_died_before_saving_its_positions_answers_each_command_once(
    stack: Endpoints, env: StoreEnv, topics: CommandTopics, unique: str
) -> None:
    """The crash between the results' acknowledgement and the positions' save: the restarted
    processor reads the batch again, finds its results on the topic and does not answer
    twice; a command sent after the crash is answered."""
    bus = env.bus()
    client = CommandClient(stack.kafka, topics, registry=bus.registry)

    def follow(a: int, b: int) -> str:  # users 1 to 4 exist
        return client.send("FollowUser", {"follower_id": a, "followee_id": b})

    ids = [follow(1, 2), follow(1, 3)]
    first = CommandProcessor(bus, stack.kafka, topics, consumer_name=f"proc-{unique}")
    handled = process_until(first, 2, 50)
    ids += [follow(1, 4), follow(2, 1)]
    # the next batch dies after its results were acknowledged, before its positions are saved
    real_save = first.positions.save

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("killed")

    first.positions.save = crash  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        for _ in range(50):
            first.process_batch(0.5)
    first.positions.save = real_save  # type: ignore[method-assign]
    first.close()
    later = follow(2, 3)

    second = CommandProcessor(bus, stack.kafka, topics, consumer_name=f"proc-{unique}")
    handled = 0
    for _ in range(50):
        handled += second.process_batch(0.5)
        if bus.previous_result(later) is not None and handled >= 1:
            break
    second.close()
    assert all(isinstance(bus.previous_result(i), Accepted) for i in [*ids, later])
    assert env.count_events() == 5
    keys = [r.key.decode() for r in read_topic(stack.kafka, topics.results) if r.key]
    assert sorted(keys) == sorted([*ids, later]), "a command answered twice or not at all"


def test_cli_command_wait_prints_the_result_as_json(
    stack: Endpoints, env: StoreEnv, topics: CommandTopics, unique: str
) -> None:
    from typer.testing import CliRunner

    from infra import cli_events  # noqa: F401  (registers `command` and `run-commands`)
    from infra.cli_app import app

    processor = CommandProcessor(env.bus(), stack.kafka, topics, consumer_name=f"proc-{unique}")
    thread = _start(processor)
    cli_env = {
        "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        **stack.settings.kafka_security_env(),  # SASL/TLS of a brought Kafka
        "TRIBUTARY_SCHEMA_REGISTRY_URL": stack.settings.registry_url,
        "TRIBUTARY_COMMANDS_TOPIC": topics.commands,
        "TRIBUTARY_COMMAND_RESULTS_TOPIC": topics.results,
        "TRIBUTARY_COMMAND_TOPIC_PARTITIONS": str(topics.partitions),
    }
    runner = CliRunner()
    try:
        data = '{"follower_id": 1, "followee_id": 2}'
        ok = runner.invoke(app, ["command", "FollowUser", "--data", data, "--wait"], env=cli_env)
        assert ok.exit_code == 0, ok.output
        accepted = json.loads(ok.stdout)
        assert accepted["status"] == "accepted" and accepted["stream_id"] == "follows-1"
        again = runner.invoke(app, ["command", "FollowUser", "--data", data, "--wait"], env=cli_env)
        assert again.exit_code == 2
        assert "already follows" in json.loads(again.stdout)["reason"]
        bad = runner.invoke(app, ["command", "FollowUser", "--data", "[1]"], env=cli_env)
        assert bad.exit_code == 1
    finally:
        processor.stop()
        thread.join(30)
    assert env.count_events() == 1


def group_offsets(stack: Endpoints, group: str, topic: str) -> dict[int, int]:
    """A consumer group's committed offsets, as ``kafka-consumer-groups --describe`` reads them
    (the admin API's ListConsumerGroupOffsets)."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(stack.kafka.client_properties())
    [future] = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
    result = future.result(timeout=30)
    return {tp.partition: tp.offset for tp in result.topic_partitions if tp.topic == topic}


def test_the_processor_shows_its_positions_to_lag_tools_and_counts_outcomes(
    stack: Endpoints, env: StoreEnv, topics: CommandTopics, unique: str
) -> None:
    heard: list[CommandOutcome] = []
    bus = env.bus()
    group = f"proc-{unique}"
    processor = CommandProcessor(
        bus, stack.kafka, topics, consumer_name=group, observer=heard.append
    )
    thread = _start(processor)
    client = CommandClient(stack.kafka, topics, registry=bus.registry)
    try:
        for n in range(1, 9):
            data = {"post_id": n, "author_id": 1, "text": f"post {n}"}
            assert isinstance(client.send_and_wait("CreatePost", data, timeout=60), Accepted)
        missing = client.send_and_wait("EditPost", {"post_id": 999, "text": "x"}, timeout=60)
        assert isinstance(missing, Rejected)
        ends = TopicAdmin(stack.kafka).end_offsets(topics.commands)
        with bus.store.engine.connect() as conn:
            stored = processor.positions.load(conn, topics.commands)
        assert sum(ends.values()) == 9 and stored == {p: o for p, o in ends.items() if o}
        # The commit is asynchronous: lag tools see the stored positions once it lands.
        deadline = time.monotonic() + 30
        while group_offsets(stack, group, topics.commands) != stored:
            assert time.monotonic() < deadline, group_offsets(stack, group, topics.commands)
            time.sleep(0.2)
    finally:
        processor.stop()
        thread.join(30)
    outcomes = [(o.entry, o.outcome) for o in heard]
    assert outcomes == [("topic", "accepted")] * 8 + [("topic", "rejected")]
    assert all(o.seconds > 0 for o in heard)
