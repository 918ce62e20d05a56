"""Records in the exact on-topic formats, produced straight to the broker (faster than CDC):
events through the outbox's own encoder (:class:`cdc.outbox.EventOutbox`: typed, Confluent wire
format, schemas in the session stack's registry), changes as the Debezium JSON envelopes CDC
writes."""

import json
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

from confluent_kafka import Producer

from cdc.connector import topic_spec_for
from cdc.publisher import LSN_HEADER, OutgoingChange
from connectors.kafka import KafkaConfig, TopicAdmin
from connectors.kafka.producing import idempotent_producer
from event_store.personal import KeyStore, MemoryKeys, encrypt_data, personal_fields
from examples.social.feed import social_outbox
from examples.social.posts import POST_EVENTS
from tributary.changes import TXID_HEADER, Row

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def post_events(
    aggregate: str, posts: int, per_post: int, registry_url: str, keys: KeyStore | None = None
) -> list[OutgoingChange]:
    """``posts`` streams of ``per_post`` events each (``PostCreated`` then ``PostEdited``),
    interleaved as a store would append them, typed (the post events' schemas registered in
    the registry at ``registry_url``, as the command processor does at start), their personal
    fields (a post's text) encrypted as the store writes them, with ``keys``."""
    outbox, ids = social_outbox(registry_url)
    keys = MemoryKeys() if keys is None else keys
    marks = {(cls.event_name, cls.schema_version): personal_fields(cls) for cls in POST_EVENTS}
    out: list[OutgoingChange] = []
    position = 0
    for version in range(1, per_post + 1):
        for post in range(posts):
            position += 1
            at = T0 + timedelta(seconds=position)
            if version == 1:
                event_type, schema_version = "PostCreated", 2
                data = {
                    "post_id": post,
                    "author_id": post % 7,
                    "text": f"post {post} #kafka",
                    "hashtags": ["kafka"],
                    "created_at": T0.isoformat(),
                }
            else:
                event_type, schema_version = "PostEdited", 1
                data = {
                    "post_id": post,
                    "author_id": post % 7,
                    "text": f"edit {version}",
                    "hashtags": [],
                    "created_at": T0.isoformat(),
                    "edited_at": at.isoformat(),
                }
            row = {
                "event_id": str(uuid.uuid4()),
                "event_type": event_type,
                "schema_version": schema_version,
                "stream_type": aggregate,
                "stream_id": str(post),
                "version": version,
                "position": position,
                "recorded_at": at.isoformat(),
                "data": json.dumps(encrypt_data(marks[(event_type, schema_version)], data, keys)),
                "metadata": "{}",
                "schema_id": ids[(event_type, schema_version)],
            }
            out += outbox.route(json.dumps({"op": "c", "after": row}), str(position).encode())
    return out


def change(
    topic: str, row_id: int, op: str, lsn: int, before: Row | None, after: Row | None
) -> OutgoingChange:
    """A Debezium change record (``converter.schemas.enable=false``)."""
    source = {
        "lsn": lsn,
        "txId": lsn // 10,
        "ts_ms": 0,
        "schema": "public",
        "table": "users",
        "snapshot": "false",
    }
    value = {"op": op, "before": before, "after": after, "source": source, "ts_ms": 0}
    headers = [(LSN_HEADER, str(lsn).encode()), (TXID_HEADER, str(lsn // 10).encode())]
    return OutgoingChange(
        topic, json.dumps({"id": row_id}).encode(), json.dumps(value).encode(), headers
    )


def tombstone(topic: str, row_id: int, lsn: int) -> OutgoingChange:
    headers = [(LSN_HEADER, str(lsn).encode()), (TXID_HEADER, str(lsn // 10).encode())]
    return OutgoingChange(topic, json.dumps({"id": row_id}).encode(), None, headers)


def produce(kafka: KafkaConfig, records: Sequence[OutgoingChange], partitions: int = 4) -> None:
    """Create the topics as CDC does (events: history; the rest: compacted) and produce."""
    admin = TopicAdmin(kafka)
    spec = topic_spec_for(partitions)
    for topic in dict.fromkeys(r.topic for r in records):
        admin.ensure(spec(topic))
    producer = idempotent_producer(kafka, {"linger.ms": 5}, java_placement=True)
    for r in records:
        producer.produce(r.topic, key=r.key, value=r.value, headers=list(r.headers))
        producer.poll(0)
    assert producer.flush(60) == 0


def produce_raw(
    kafka: KafkaConfig, topic: str, items: Iterable[tuple[bytes, bytes | None]]
) -> None:
    producer = Producer(kafka.client_properties(partitioner="murmur2_random"))
    for key, value in items:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0
