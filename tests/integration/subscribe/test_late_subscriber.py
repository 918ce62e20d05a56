"""A subscriber started after 10,000 events reads them all, typed, in per-key order."""

import time
from collections import defaultdict
from typing import Any

from connectors.subscriber import EventRecord
from event_store.codec import EventCodec
from event_store.event import EventRegistry
from event_store.personal import MemoryKeys, Revealer
from event_store.subscription import PublishedEvent, domain_events
from examples.social.posts import POST_EVENTS, POST_UPCASTERS, PostCreated, PostEdited
from tests.integration.conftest import Endpoints
from tests.integration.subscribe.conftest import read_until, subscribed
from tests.integration.subscribe.feed import post_events, produce

POSTS, PER_POST = 1_000, 10  # 10,000 events


def test_a_late_subscriber_reads_every_event_typed_in_per_key_order(
    stack: Endpoints, unique: str
) -> None:
    aggregate = f"post_{unique}"
    keys = MemoryKeys()  # a post's text is personal: the feed encrypts it, the reader reveals it
    records = post_events(aggregate, POSTS, PER_POST, stack.settings.registry_url, keys)
    produce(stack.kafka, records, partitions=4)
    topic = f"events.{aggregate}"
    codec = EventCodec(EventRegistry(POST_EVENTS), POST_UPCASTERS)

    started = time.monotonic()
    with subscribed(
        stack,
        [topic],
        f"late-{unique}",
        event_decoder=domain_events(codec),
        on_error=_fail,
        reveal=Revealer(keys),
    ) as subscriber:
        got = read_until(subscriber, lambda out: len(out) >= POSTS * PER_POST, timeout=90)
        extra = subscriber.poll(2.0)
    elapsed = time.monotonic() - started
    print(f"read {len(got)} events in {elapsed:.1f}s (group join included)")

    assert extra is None
    assert len(got) == POSTS * PER_POST
    events = [d.value for d in got if isinstance(d.value, PublishedEvent)]
    assert len(events) == len(got)
    sent_ids = {dict(r.headers)["event_id"].decode() for r in records if r.topic == topic}
    assert {str(p.envelope.event_id) for p in events} == sent_ids
    versions: dict[str, list[int]] = defaultdict(list)
    for delivery, p in zip(got, events, strict=True):
        assert delivery.key == p.stream_id.encode()
        assert delivery.position.topic == topic
        versions[p.stream_id].append(p.version)
        assert isinstance(p.envelope, EventRecord) and p.envelope.occurred_at.tzinfo is not None
        if p.version == 1:
            assert isinstance(p.event, PostCreated) and p.event.hashtags == ("kafka",)
        else:
            assert isinstance(p.event, PostEdited) and p.event.text == f"edit {p.version}"
    assert len(versions) == POSTS
    assert all(v == list(range(1, PER_POST + 1)) for v in versions.values())  # per-key order
    partitions = {d.position.partition for d in got}
    assert partitions == {0, 1, 2, 3}
    for part in partitions:  # offsets grow within a partition
        offsets = [d.position.offset for d in got if d.position.partition == part]
        assert offsets == sorted(offsets)


def _fail(record: Any) -> None:
    raise AssertionError(f"undecodable: {record.reason}")
