"""A record that cannot be decoded goes to the caller's error policy — by default to the
dead-letter topic with its reason — and the subscriber goes on."""

import json

import pytest

from connectors.subscriber import (
    EventRecord,
    UndecodableRecordError,
    raise_undecodable,
)
from tests.integration.conftest import Endpoints
from tests.integration.kafka_reading import read_topic
from tests.integration.subscribe.conftest import read_until, subscribed
from tests.integration.subscribe.feed import change, post_events, produce, produce_raw


def test_corrupt_records_go_to_the_dead_letter_topic_with_their_reason(
    stack: Endpoints, unique: str
) -> None:
    aggregate, table = f"post_{unique}", f"cdc.public.users_{unique}"
    events = post_events(aggregate, 10, 2, stack.settings.registry_url)
    produce(stack.kafka, events[:10], partitions=1)
    changes = [change(table, i, "c", 100 + i, None, {"id": i}) for i in range(3)]
    produce(stack.kafka, changes[:1], partitions=1)
    topic = f"events.{aggregate}"
    truncated = (events[0].value or b"")[:5] + b"\x02"  # a known schema id, then no body
    produce_raw(stack.kafka, topic, [(b"3", b"not avro at all"), (b"4", truncated)])
    produce_raw(stack.kafka, table, [(b'{"id": 9}', b"{not json")])
    produce(stack.kafka, events[10:], partitions=1)
    produce(stack.kafka, changes[1:], partitions=1)

    with subscribed(stack, [topic, table], f"dlq-{unique}") as subscriber:
        got = read_until(subscriber, lambda out: len(out) >= 20 + 3)
        assert subscriber.poll(1.0) is None

    assert [d.value.version for d in got if isinstance(d.value, EventRecord)] == [1] * 10 + [2] * 10
    assert [d.position.offset for d in got if d.position.topic == table] == [0, 2, 3]

    letters = read_topic(stack.kafka, f"{topic}.dlq")
    assert [(r.key, r.value) for r in letters] == [
        (b"3", b"not avro at all"),
        (b"4", truncated),
    ]
    first = letters[0].headers
    assert b"AvroDecodeError" in (first["tributary.error.reason"] or b"")
    assert b"wire format" in (first["tributary.error.reason"] or b"")
    assert b"corrupt" in (letters[1].headers["tributary.error.reason"] or b"")
    assert first["tributary.error.stage"] == b"decode"
    assert first["tributary.subscriber"] == f"dlq-{unique}".encode()
    assert first["tributary.source.topic"] == topic.encode()
    assert first["tributary.source.offset"] == b"10"
    assert letters[1].headers["tributary.source.offset"] == b"11"
    (bad_change,) = read_topic(stack.kafka, f"{table}.dlq")
    assert bad_change.value == b"{not json"
    assert b"not JSON" in (bad_change.headers["tributary.error.reason"] or b"")
    assert json.loads(bad_change.headers["tributary.source.offset"] or b"") == 1


def test_a_named_dead_letter_topic_and_a_policy_that_stops(stack: Endpoints, unique: str) -> None:
    aggregate = f"post_{unique}"
    topic = f"events.{aggregate}"
    events = post_events(aggregate, 2, 1, stack.settings.registry_url)
    produce(stack.kafka, events, partitions=1)
    produce_raw(stack.kafka, topic, [(b"0", b"garbage")])
    produce(stack.kafka, post_events(aggregate, 2, 1, stack.settings.registry_url), partitions=1)

    # assign mode (a replay): no group membership, no commits
    with subscribed(stack, [topic], None, dead_letter_topic=f"dead-{unique}") as subscriber:
        got = read_until(subscriber, lambda out: len(out) >= 4, timeout=30)
    assert [d.position.offset for d in got] == [0, 1, 3, 4]
    (letter,) = read_topic(stack.kafka, f"dead-{unique}")
    assert letter.value == b"garbage"

    with subscribed(stack, [topic], None, on_error=raise_undecodable) as sub:
        assert read_until(sub, lambda out: len(out) >= 2, timeout=30)[-1].position.offset == 1
        for _ in range(2):  # it stops on the record, and meets it again if polled on
            with pytest.raises(UndecodableRecordError, match=r"@2: AvroDecodeError"):
                sub.poll(5.0)
