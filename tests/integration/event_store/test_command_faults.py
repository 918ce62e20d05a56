"""No poison loops (issue 13, item 1): a command whose content makes its handling fail is
rejected naming the cause, recorded, and the processor moves on to the next command.

Through the real broker and PostgreSQL: a ``CreatePost`` whose text holds a NUL character
(PostgreSQL refuses it in ``jsonb``, SQLSTATE 22P05), a test handler that raises
``ZeroDivisionError`` for one command, and a command id holding a NUL character, each
followed on the same partition by a command that is accepted, all handled by one processor
that keeps running.
"""

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from hashlib import sha256
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from connectors.kafka import TopicAdmin
from event_store import (
    Accepted,
    Command,
    CommandBus,
    CommandResult,
    HandlerContext,
    Rejected,
    SnapshotPolicy,
    result_from_json,
)
from event_store.command_topic import CommandClient, CommandProcessor, CommandTopics, ensure_topics
from event_store.faults import storable_text
from examples.social import CreatePost, Post, social_registry
from examples.social.posts import post_stream
from tests.integration.conftest import Endpoints
from tests.integration.event_store.conftest import StoreEnv, plain_text


@dataclass(frozen=True)
class ScorePost(Command):
    """A test command whose handler divides by ``weight``: 0 raises ZeroDivisionError."""

    post_id: int
    weight: int


def score_post(post: Post, command: ScorePost, ctx: HandlerContext) -> None:
    post.edit(command.post_id, f"score {100 // command.weight}", ctx.now)


@pytest.fixture
def topics(stack: Endpoints, unique: str) -> Iterator[CommandTopics]:
    names = CommandTopics(f"commands-{unique}", f"command-results-{unique}", partitions=2)
    ensure_topics(stack.kafka, names)
    yield names
    TopicAdmin(stack.kafka).delete(names.commands, names.results)


def _results(
    stack: Endpoints, topics: CommandTopics, wanted: dict[str, int], timeout: float = 60
) -> dict[str, list[CommandResult]]:
    """Every result on the (test's own) results topic, by command id, once each wanted id
    has (at least) its wanted number of results."""
    consumer = Consumer(
        stack.kafka.client_properties(**{"group.id": "t", "enable.auto.commit": False})
    )
    consumer.assign([TopicPartition(topics.results, p, 0) for p in range(topics.partitions)])
    found: dict[str, list[CommandResult]] = {}
    deadline = time.monotonic() + timeout
    try:
        while not _complete(found, wanted) and time.monotonic() < deadline:
            for msg in consumer.consume(10, 0.5):
                key, value = msg.key(), msg.value()
                if msg.error() is None and key is not None and value is not None:
                    result = result_from_json(json.loads(value))
                    found.setdefault(key.decode("utf-8", "surrogatepass"), []).append(result)
    finally:
        consumer.close()
    assert _complete(found, wanted), f"results: {found}, wanted: {wanted}"
    return found


def _complete(found: dict[str, list[CommandResult]], wanted: dict[str, int]) -> bool:
    return all(len(found.get(command_id, [])) >= n for command_id, n in wanted.items())


def test_poison_commands_are_rejected_and_the_next_on_their_partition_is_accepted(
    stack: Endpoints, env: StoreEnv, topics: CommandTopics, unique: str
) -> None:
    registry = social_registry(env.users)
    registry.register(ScorePost, Post, lambda c: post_stream(c.post_id), score_post)
    bus = CommandBus(env.store, registry, SnapshotPolicy(100))
    processor = CommandProcessor(bus, stack.kafka, topics, consumer_name=f"proc-{unique}")
    thread = threading.Thread(target=processor.run, kwargs={"poll_timeout": 0.2}, daemon=True)
    thread.start()
    client = CommandClient(stack.kafka, topics, registry=registry)
    nul_id = "nul-id-\x00"
    sent: list[tuple[str, str, dict[str, Any]]] = [
        ("nul-text", "CreatePost", {"post_id": 9, "author_id": 1, "text": "a\u0000b"}),
        ("create", "CreatePost", {"post_id": 9, "author_id": 1, "text": "ok"}),
        ("zero", "ScorePost", {"post_id": 9, "weight": 0}),
        ("score", "ScorePost", {"post_id": 9, "weight": 4}),
        (nul_id, "CreatePost", {"post_id": 10, "author_id": 1, "text": "nul in the id"}),
        ("after", "CreatePost", {"post_id": 11, "author_id": 2, "text": "still running"}),
    ]
    try:
        for command_id, command_type, data in sent:  # one key: one partition, in this order
            client.send(command_type, data, command_id=command_id, key="one-partition")
        results = _results(stack, topics, {command_id: 1 for command_id, _, _ in sent})
        assert thread.is_alive(), "the processor stopped"
        assert all(len(r) == 1 for r in results.values()), results

        [nul_text] = results["nul-text"]
        assert isinstance(nul_text, Rejected) and nul_text.command_id == "nul-text"
        assert "cannot store" in nul_text.reason and "22P05" in nul_text.reason, nul_text
        [zero] = results["zero"]
        assert isinstance(zero, Rejected) and zero.command_id == "zero"
        assert "ZeroDivisionError: integer division or modulo by zero" in zero.reason, zero
        [bad_id] = results[nul_id]
        assert isinstance(bad_id, Rejected) and bad_id.command_id == nul_id
        assert "NUL character" in bad_id.reason, bad_id
        accepted = [results[i][0] for i in ("create", "score", "after")]
        assert [type(r) for r in accepted] == [Accepted] * 3, accepted

        # nothing appended for the rejected ones; the accepted ones left no version gap
        assert [e.version for e in env.store.read_stream("post-9")] == [1, 2]
        texts = [
            plain_text(env.admin, env.schema, e.data["author_id"], e.data["text"])
            for e in env.store.read_stream("post-9")
        ]
        assert texts == ["ok", "score 25"]
        assert env.store.read_stream("post-10") == []
        assert env.count_events() == 3
        # each rejection is recorded like any other (the NUL id under its escaped form) ...
        assert bus.previous_result("nul-text") == nul_text
        assert bus.previous_result("zero") == zero
        recorded = bus.previous_result(storable_text(nul_id))
        assert isinstance(recorded, Rejected) and recorded.reason == bad_id.reason

        # ... so a repeat gets the same answer, and the same processor still answers it
        last = ("last", "CreatePost", {"post_id": 12, "author_id": 3, "text": "x"})
        for command_id, command_type, data in [sent[0], sent[2], sent[4], last]:
            client.send(command_type, data, command_id=command_id, key="one-partition")
        again = _results(stack, topics, {"nul-text": 2, "zero": 2, nul_id: 2, "last": 1})
        for command_id in ("nul-text", "zero", nul_id):
            assert again[command_id] == [results[command_id][0]] * 2, again[command_id]
        assert isinstance(again["last"][0], Accepted)
        assert env.count_events() == 4
        deadline = time.monotonic() + 10  # counted once the batch's offsets are stored
        while processor.handled < len(sent) + 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert thread.is_alive() and processor.handled == len(sent) + 4
    finally:
        processor.stop()
        thread.join(30)
    assert not thread.is_alive()


def test_a_rejection_the_store_cannot_record_is_answered_the_same_way_every_time(
    env: StoreEnv,
) -> None:
    # through the bus directly (the envelope refuses such ids before): too large for the
    # commands table's index, so neither the command nor its rejection can be recorded
    bus = env.bus()
    huge = "".join(sha256(b"%d" % i).hexdigest() for i in range(300))
    first = bus.send(CreatePost(7, 1, "x"), huge)
    assert isinstance(first, Rejected) and first.command_id == huge
    assert "index row" in first.reason and "54000" in first.reason, first.reason
    assert bus.send(CreatePost(7, 1, "x"), huge) == first
    assert bus.previous_result(huge) is None and env.count_events() == 0
    assert isinstance(bus.send(CreatePost(7, 1, "x"), "short"), Accepted)
