"""A generated workload for the analytics jobs with known event times, written to Kafka in the
wire formats the platform produces: activity as the front end writes it (skewed device clocks,
events held on devices, within and beyond the allowed lateness), posts, likes and follows as
the outbox's Avro events (domain time vs. recording time chosen per event: late posts too),
users as Debezium changes with commit times (renames during the hour).

Every topic is written in receive order (the order a server would have appended it); the
model of what was generated stays here for :mod:`tests.integration.analytics.reference`.
"""

import json
import random
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from connectors.kafka import KafkaConfig, TopicAdmin, history_topic, state_topic
from connectors.kafka.producing import idempotent_producer
from examples.social.activity import ActivityEvent, ActivityPlan, ActivityProducer, generate
from examples.social.analytics.common import AnalyticsConfig
from examples.social.feed import social_outbox
from projections.time import MINUTE_MS, Lateness

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
TAGS = ("kafka", "spark", "flink", "stream", "window", "join")
USERS = tuple(range(1, 9))


@dataclass(frozen=True)
class PostEvent:
    post_id: int
    author: int
    tags: tuple[str, ...]
    created: int  # domain time (ms)
    recorded: int  # when the event store recorded it (ms)
    event_id: str


@dataclass(frozen=True)
class LikeEvent:
    like_id: str  # the event id
    post_id: int
    author: int
    liker: int
    liked: int
    recorded: int


@dataclass(frozen=True)
class FollowEvent:
    follower: int
    followee: int
    kind: str  # follow | unfollow
    at: int
    event_id: str


@dataclass(frozen=True)
class UserVersion:
    user_id: int
    handle: str
    name: str
    committed: int  # source.ts_ms
    lsn: int


@dataclass
class Workload:
    lateness: Lateness
    activity: list[ActivityEvent] = field(default_factory=list)
    posts: list[PostEvent] = field(default_factory=list)
    likes: list[LikeEvent] = field(default_factory=list)
    follows: list[FollowEvent] = field(default_factory=list)
    users: list[UserVersion] = field(default_factory=list)


def _hold(rng: random.Random, lateness: Lateness, late: float, beyond: float) -> int:
    roll = rng.random()
    if roll < beyond:
        return lateness.allowed_ms + rng.randrange(60_000, 10 * MINUTE_MS)
    if roll < beyond + late:
        return rng.randrange(30_000, lateness.allowed_ms - 10_000)
    return rng.randrange(0, 2_000)


def make_workload(lateness: Lateness, seed: int = 11, posts: int = 160) -> Workload:
    """About 1,000 records spanning two hours of event time."""
    rng = random.Random(seed)
    work = Workload(lateness)
    work.activity = generate(
        ActivityPlan(sessions=28, users=len(USERS), seed=seed, allowed_ms=lateness.allowed_ms)
    )
    ids = iter(range(1, 10_000))

    def event_id() -> str:
        return str(uuid.UUID(int=rng.getrandbits(128)))

    def post(author: int, created: int, hold: int | None = None) -> PostEvent:
        tags = tuple(sorted(rng.sample(TAGS, rng.choice((1, 1, 2)))))
        held = _hold(rng, lateness, 0.12, 0.05) if hold is None else hold
        made = PostEvent(next(ids), author, tags, created, created + held, event_id())
        work.posts.append(made)
        return made

    span = 2 * 60 * MINUTE_MS
    for _ in range(posts):
        post(rng.choice(USERS), T0 + rng.randrange(0, span))
    # Bursts: 6 posts in 40 s; a burst completed by a late post; a burst whose start a late
    # post moves earlier (the first occurrence is retracted); 4 posts only (no burst).
    for offsets, holds in (
        ((0, 8_000, 16_000, 24_000, 32_000, 40_000), (0,) * 6),
        ((0, 10_000, 20_000, 30_000, 45_000), (0, 0, 0, 0, 150_000)),
        ((0, 10_000, 20_000, 30_000, 40_000, 50_000), (0, 200_000, 0, 0, 0, 0)),
        ((0, 5_000, 10_000, 15_000), (0,) * 4),
    ):
        author, start = rng.choice(USERS), T0 + rng.randrange(10 * MINUTE_MS, span - MINUTE_MS)
        for offset, hold in zip(offsets, holds, strict=True):
            post(author, start + offset, hold)
    for _ in range(60):
        target = rng.choice(work.posts)
        liked = target.recorded + rng.randrange(1_000, 30 * MINUTE_MS)
        work.likes.append(
            LikeEvent(
                event_id(),
                target.post_id,
                target.author,
                rng.choice(USERS),
                liked,
                liked + rng.randrange(0, 1_500),
            )
        )
    pairs = [(a, b) for a in USERS for b in USERS if a != b]
    rng.shuffle(pairs)
    for index, (a, b) in enumerate(pairs[:24]):
        at = T0 + rng.randrange(0, span - 40 * MINUTE_MS)
        for kind, when in [("follow", at)] + (
            [("unfollow", at + rng.randrange(30_000, 9 * MINUTE_MS))]
            if index % 3 == 0
            else [("unfollow", at + rng.randrange(11 * MINUTE_MS, 30 * MINUTE_MS))]
            if index % 3 == 1
            else []
        ):
            work.follows.append(FollowEvent(a, b, kind, when, event_id()))
    lsn = 40_000_000
    changes = [(T0 - 10 * MINUTE_MS, u, 0) for u in USERS]
    changes += [(T0 + rng.randrange(0, span), rng.choice(USERS), n + 1) for n in range(14)]
    for committed, user, rename in sorted(changes):
        lsn += rng.randrange(100, 5_000)
        handle = f"user{user}" if rename == 0 else f"user{user}-r{rename}"
        work.users.append(UserVersion(user, handle, f"User {user} v{rename}", committed, lsn))
    return work


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat()


class AnalyticsFeed:
    """Writes a :class:`Workload` to the topics of an :class:`AnalyticsConfig`."""

    def __init__(self, config: AnalyticsConfig, partitions: int = 2) -> None:
        self.config = config
        self.kafka: KafkaConfig = config.kafka
        admin = TopicAdmin(self.kafka)
        admin.ensure(state_topic(config.users_topic, partitions))
        for topic in (config.posts_topic, config.follows_topic, config.subjects_topic):
            admin.ensure(history_topic(topic, partitions))
        self.activity = ActivityProducer(self.kafka, config.activity_topic, partitions)
        self.producer = idempotent_producer(self.kafka, {"linger.ms": 10}, java_placement=True)
        self.outbox, self.schema_ids = social_outbox(config.registry_url)
        self.position = 9_000_000

    def write(self, work: Workload) -> None:
        self.write_users(work.users)
        self.write_events(work)
        self.activity.send(work.activity)
        self.activity.flush()
        self.flush()

    def write_users(self, users: Iterable[UserVersion]) -> None:
        for version in users:
            row = {
                "id": version.user_id,
                "handle": version.handle,
                "display_name": version.name,
                "bio": None,
                "updated_at": iso(version.committed),
            }
            envelope = {
                "before": None,
                "after": row,
                "op": "u" if "-r" in version.handle else "c",
                "source": {
                    "lsn": version.lsn,
                    "ts_ms": version.committed,
                    "txId": version.lsn // 2,
                    "schema": "public",
                    "table": "users",
                },
                "ts_ms": version.committed + 40,
            }
            self.producer.produce(
                self.config.users_topic,
                key=json.dumps({"id": version.user_id}).encode(),
                value=json.dumps(envelope).encode(),
                headers=[("lsn", str(version.lsn).encode())],
            )

    def write_events(self, work: Workload) -> None:
        records: list[tuple[int, str, str, dict[str, Any], str]] = []
        for p in work.posts:
            data = {
                "post_id": p.post_id,
                "author_id": p.author,
                "text": " ".join(f"#{t}" for t in p.tags),
                "hashtags": list(p.tags),
                "created_at": iso(p.created),
            }
            records.append((p.recorded, f"post-{p.post_id}", "PostCreated", data, p.event_id))
        for like in work.likes:
            data = {
                "post_id": like.post_id,
                "author_id": like.author,
                "user_id": like.liker,
                "liked_at": iso(like.liked),
            }
            records.append((like.recorded, f"post-{like.post_id}", "PostLiked", data, like.like_id))
        for f in work.follows:
            stamp = "followed_at" if f.kind == "follow" else "unfollowed_at"
            data = {"follower_id": f.follower, "followee_id": f.followee, stamp: iso(f.at)}
            kind = "UserFollowed" if f.kind == "follow" else "UserUnfollowed"
            records.append((f.at, f"follows-{f.follower}", kind, data, f.event_id))
        # The log is in recording order; each stream's versions follow it.
        versions: dict[str, int] = {}
        for recorded, stream, kind, data, eid in sorted(records, key=lambda r: (r[0], r[1])):
            versions[stream] = versions.get(stream, 0) + 1
            self.position += 1
            schema_version = 2 if kind == "PostCreated" else 1
            row = {
                "event_id": eid,
                "event_type": kind,
                "schema_version": schema_version,
                "schema_id": self.schema_ids[(kind, schema_version)],
                "stream_type": stream.split("-")[0],
                "stream_id": stream,
                "version": versions[stream],
                "position": self.position,
                "recorded_at": iso(recorded),
                "data": json.dumps(data),
                "metadata": "{}",
            }
            envelope = {"before": None, "after": row, "op": "c", "source": {"lsn": self.position}}
            for out in self.outbox.route(json.dumps(envelope), str(self.position).encode()):
                if not out.topic.startswith("events."):
                    continue
                topic = (
                    self.config.posts_topic
                    if out.topic == "events.post"
                    else self.config.follows_topic
                )
                self.producer.produce(topic, key=out.key, value=out.value, headers=out.headers)

    def write_forgotten(self, user_id: int, at: int) -> None:
        """``SubjectForgotten`` of the user, as `tributary forget` appends it (stream
        ``user-<id>`` of type ``subject``, no typed schema) and the outbox publishes it."""
        self.position += 1
        data = {"subject_type": "user", "subject_id": str(user_id), "forgotten_at": iso(at)}
        row = {
            "event_id": str(uuid.uuid4()),
            "event_type": "SubjectForgotten",
            "schema_version": 1,
            "schema_id": None,
            "stream_type": "subject",
            "stream_id": f"user-{user_id}",
            "version": 1,
            "position": self.position,
            "recorded_at": iso(at),
            "data": json.dumps(data),
            "metadata": "{}",
        }
        envelope = {"before": None, "after": row, "op": "c", "source": {"lsn": self.position}}
        for out in self.outbox.route(json.dumps(envelope), str(self.position).encode()):
            assert out.topic == "events.subject", out.topic
            self.producer.produce(
                self.config.subjects_topic, key=out.key, value=out.value, headers=out.headers
            )
        self.flush()

    def flush(self) -> None:
        assert self.producer.flush(30) == 0
