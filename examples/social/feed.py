"""A generated social workload written to Kafka in the wire formats CDC produces: users as
Debezium changes of the CRUD table, posts and follows as the outbox's Avro events. It keeps
its own model of the source of truth (:class:`SocialState`) to compare the views with.

Used by the fast view tests and the benchmarks; the end-to-end tests run the real connector
and event store.
"""

import json
import random
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from cdc.outbox import EventOutbox
from connectors.kafka import KafkaConfig, TopicAdmin, history_topic, state_topic
from connectors.kafka.config import ClientValue
from connectors.kafka.producing import idempotent_producer
from connectors.schema_registry.client import RegistryClient
from event_store.personal import KeyStore, MemoryKeys, encrypt_data, personal_fields
from event_store.schemas import register_event_schemas
from examples.social import hashtags
from examples.social.follows import FOLLOW_EVENTS
from examples.social.posts import POST_EVENTS
from examples.social.views.reference import SocialState

Headers = list[tuple[str, str | bytes | None]]
Record = tuple[str, bytes, bytes | None, Headers]


def social_outbox(registry_url: str) -> tuple[EventOutbox, dict[tuple[str, int], int]]:
    """The outbox encoder, and the social events' schema ids once registered in the registry
    at ``registry_url`` (as the command processor registers them at start)."""
    client = RegistryClient(registry_url)
    return EventOutbox(client), register_event_schemas([*POST_EVENTS, *FOLLOW_EVENTS], client)


WORDS = ["kafka", "spark", "debezium", "stream", "table", "join", "window", "lambda", "ledger"]


@dataclass
class SocialFeed:
    kafka: KafkaConfig
    prefix: str  # unique per test: topics <prefix>.public.users, <prefix>.events.post, ...
    partitions: int = 2
    seed: int = 5
    state: SocialState = field(default_factory=SocialState)
    sent: list[Record] = field(default_factory=list)
    registry_url: str | None = None  # the schema registry (required: events are typed)
    #: the subject keys personal fields are encrypted with (event_store.personal); views
    #: decrypt with the same table. None: keys in memory (no view can read the text).
    keys: KeyStore | None = None

    #: producer settings beside idempotence and Java's key placement (a benchmark's feed sizes
    #: them for bulk)
    producer_properties: ClassVar[dict[str, ClientValue]] = {
        "linger.ms": 10,
    }

    def event_topic_prefix(self) -> str:
        """What the events' topic names start with (``<prefix>.events.``: unique per test)."""
        return f"{self.prefix}.events."

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.users_topic = f"{self.prefix}.public.users"
        self.event_prefix = self.event_topic_prefix()
        admin = TopicAdmin(self.kafka)
        admin.ensure(state_topic(self.users_topic, self.partitions))
        for kind in ("post", "follows"):
            admin.ensure(history_topic(self.event_prefix + kind, self.partitions))
        self.producer = idempotent_producer(
            self.kafka, self.producer_properties, java_placement=True
        )
        assert self.registry_url is not None, "events are typed: pass registry_url"
        self.outbox, self.schema_ids = social_outbox(self.registry_url)
        self.personal = {
            (cls.event_name, cls.schema_version): personal_fields(cls)
            for cls in [*POST_EVENTS, *FOLLOW_EVENTS]
        }
        if self.keys is None:
            self.keys = MemoryKeys()
        self.lsn = 5_000_000
        self.versions: dict[str, int] = {}
        self.next_post = 1
        self.clock = datetime(2026, 1, 1, tzinfo=UTC)

    # -- users: Debezium changes ---------------------------------------------------------

    def _lsn(self) -> int:
        self.lsn += self.rng.randrange(8, 64)
        return self.lsn

    def upsert_user(
        self, user_id: int, handle: str, name: str | None, bio: str | None = None
    ) -> None:
        op = "u" if user_id in self.state.users else "c"
        row = {
            "id": user_id,
            "handle": handle,
            "display_name": name,
            "bio": bio,
            "updated_at": "2026-01-01T00:00:00Z",
        }
        lsn = self._lsn()
        envelope = {
            "before": None,
            "after": row,
            "op": op,
            "source": {"lsn": lsn, "txId": lsn // 2, "schema": "public", "table": "users"},
            "ts_ms": 0,
        }
        self._produce(
            self.users_topic,
            json.dumps({"id": user_id}).encode(),
            json.dumps(envelope).encode(),
            [("lsn", str(lsn).encode())],
        )
        self.state.users[user_id] = {"handle": handle, "display_name": name, "bio": bio}

    def delete_user(self, user_id: int) -> None:
        lsn = self._lsn()
        key = json.dumps({"id": user_id}).encode()
        envelope = {
            "before": {"id": user_id},
            "after": None,
            "op": "d",
            "source": {"lsn": lsn, "txId": lsn // 2},
            "ts_ms": 0,
        }
        headers: Headers = [("lsn", str(lsn).encode())]
        self._produce(self.users_topic, key, json.dumps(envelope).encode(), headers)
        self._produce(self.users_topic, key, None, headers)
        del self.state.users[user_id]

    # -- events: the outbox's Avro records ------------------------------------------------

    def _event(
        self,
        stream_type: str,
        stream_id: str,
        event_type: str,
        data: dict[str, Any],
        schema_version: int = 1,
    ) -> None:
        version = self.versions.get(stream_id, 0) + 1
        self.versions[stream_id] = version
        marks = self.personal.get((event_type, schema_version))
        if marks:
            assert self.keys is not None
            data = encrypt_data(marks, data, self.keys)
        lsn = self._lsn()
        row = {
            "event_id": str(uuid.UUID(int=self.rng.getrandbits(128))),
            "event_type": event_type,
            "schema_version": schema_version,
            "stream_type": stream_type,
            "stream_id": stream_id,
            "version": version,
            "position": lsn,
            "recorded_at": self.clock.isoformat().replace("+00:00", "Z"),
            "data": json.dumps(data),
            "metadata": "{}",
            "schema_id": self.schema_ids[(event_type, schema_version)],
        }
        envelope = {"before": None, "after": row, "op": "c", "source": {"lsn": lsn}}
        for out in self.outbox.route(json.dumps(envelope), str(lsn).encode()):
            if out.topic.startswith("events."):
                topic = self.event_prefix + out.topic.removeprefix("events.")
                self._produce(topic, out.key, out.value, list(out.headers))

    def _tick(self) -> str:
        self.clock += timedelta(seconds=self.rng.randrange(1, 90))
        return self.clock.isoformat().replace("+00:00", "Z")  # as the store writes times

    def create_post(self, author_id: int) -> int:
        post_id, self.next_post = self.next_post, self.next_post + 1
        text = " ".join(self.rng.sample(WORDS, 3)) + f" #{self.rng.choice(WORDS)} p{post_id}"
        now = self._tick()
        data = {
            "post_id": post_id,
            "author_id": author_id,
            "text": text,
            "hashtags": list(hashtags(text)),
            "created_at": now,
        }
        self._event("post", f"post-{post_id}", "PostCreated", data, schema_version=2)
        self.state.posts[post_id] = {**data, "edited_at": None}
        return post_id

    def edit_post(self, post_id: int) -> None:
        post = self.state.posts[post_id]
        text = f"edited {self.rng.choice(WORDS)} #{self.rng.choice(WORDS)} p{post_id}"
        now = self._tick()
        data = {
            **{k: post[k] for k in ("post_id", "author_id", "created_at")},
            "text": text,
            "hashtags": list(hashtags(text)),
            "edited_at": now,
        }
        self._event("post", f"post-{post_id}", "PostEdited", data)
        post.update(text=text, hashtags=list(hashtags(text)), edited_at=now)

    def delete_post(self, post_id: int) -> None:
        post = self.state.posts.pop(post_id)
        data = {k: post[k] for k in ("post_id", "author_id", "hashtags", "created_at")}
        self._event("post", f"post-{post_id}", "PostDeleted", {**data, "deleted_at": self._tick()})

    def follow(self, follower: int, followee: int) -> None:
        data = {"follower_id": follower, "followee_id": followee, "followed_at": self._tick()}
        self._event("follows", f"follows-{follower}", "UserFollowed", data)
        self.state.follows.add((follower, followee))

    def unfollow(self, follower: int, followee: int) -> None:
        data = {"follower_id": follower, "followee_id": followee, "unfollowed_at": self._tick()}
        self._event("follows", f"follows-{follower}", "UserUnfollowed", data)
        self.state.follows.discard((follower, followee))

    # -- a random workload ---------------------------------------------------------------

    def run(self, operations: int, users: int = 40) -> None:
        """Random user inserts/renames/deletes, posts, edits, deletes, follows, unfollows."""
        for _ in range(operations):
            roll = self.rng.random()
            ids = sorted(self.state.users)
            if len(ids) < 5 or roll < 0.06:
                user_id = self.rng.randrange(1, users + 1)
                self.upsert_user(user_id, f"user{user_id}", f"User {user_id}", "hello")
            elif roll < 0.10:
                user_id = self.rng.choice(ids)
                self.upsert_user(user_id, f"user{user_id}", f"Renamed {self.rng.randrange(10**6)}")
            elif roll < 0.11 and len(ids) > 8:
                self.delete_user(self.rng.choice(ids))
            elif roll < 0.45:
                self.create_post(self.rng.choice(ids))
            elif roll < 0.55 and self.state.posts:
                self.edit_post(self.rng.choice(sorted(self.state.posts)))
            elif roll < 0.62 and self.state.posts:
                self.delete_post(self.rng.choice(sorted(self.state.posts)))
            elif roll < 0.88:
                a, b = self.rng.sample(ids, 2)
                if (a, b) not in self.state.follows:
                    self.follow(a, b)
            elif self.state.follows:
                self.unfollow(*self.rng.choice(sorted(self.state.follows)))
        self.flush()

    # -- plumbing ------------------------------------------------------------------------

    def _produce(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers
    ) -> None:
        self.sent.append((topic, key or b"", value, headers))
        self.producer.produce(topic, key=key, value=value, headers=headers)
        self.producer.poll(0)

    def resend(self, records: list[Record]) -> None:
        """Produce already-sent records again (upstream at-least-once)."""
        for topic, key, value, headers in records:
            self.producer.produce(topic, key=key, value=value, headers=headers)
        self.flush()

    def flush(self) -> None:
        assert self.producer.flush(30) == 0

    @property
    def topics(self) -> dict[str, str]:
        return {
            "users": self.users_topic,
            "posts": self.event_prefix + "post",
            "follows": self.event_prefix + "follows",
        }
