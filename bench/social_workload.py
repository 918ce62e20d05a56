"""The social workload of ``bench/replay.py --views social`` (not a test).

Writes, on the real topic names, what CDC would publish for a social app: ``users`` rows as
Debezium changes on ``cdc.public.users``, posts and follows as the outbox's Avro events on
``events.post`` and ``events.follows`` (typed, Confluent wire format, the social events'
schemas registered in the stack's schema registry).
The record formats and the model of the source of truth come from the social example
(:class:`examples.social.feed.SocialFeed`); this module only sizes the producer for a
benchmark and draws the operations in O(1) each.

Mix: the ``users`` inserts first (so every post and follow has its users), then of the rest
2% renames, 40% posts created, 12% edited, 8% deleted, 30% follows, 8% unfollows (an edit,
delete or unfollow with nothing to act on becomes a post or a follow).
"""

import random
from collections import Counter
from typing import Any, ClassVar

from connectors.kafka.config import ClientValue
from examples.social.feed import Headers, SocialFeed
from examples.social.views.reference import SocialState

MIX = (
    ("rename", 0.02),
    ("post", 0.40),
    ("edit", 0.12),
    ("delete", 0.08),
    ("follow", 0.30),
    ("unfollow", 0.08),
)


class BenchFeed(SocialFeed):
    """:class:`SocialFeed` on ``cdc.public.users`` / ``events.*`` with a bulk producer, not
    keeping a copy of every record sent."""

    producer_properties: ClassVar[dict[str, ClientValue]] = {
        "linger.ms": 20,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 1_000_000,
    }

    def event_topic_prefix(self) -> str:
        return "events."  # the real names

    def __post_init__(self) -> None:
        super().__post_init__()
        self.records = 0

    def _produce(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers
    ) -> None:
        self.records += 1
        self.producer.produce(topic, key=key, value=value, headers=headers)
        self.producer.poll(0)

    def flush(self) -> None:
        assert self.producer.flush(300) == 0


class Picker:
    """A set with O(1) insert, remove and random choice."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.index: dict[Any, int] = {}

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, item: Any) -> bool:
        return item in self.index

    def add(self, item: Any) -> None:
        self.index[item] = len(self.items)
        self.items.append(item)

    def remove(self, item: Any) -> None:
        at = self.index.pop(item)
        last = self.items.pop()
        if at < len(self.items):
            self.items[at] = last
            self.index[last] = at

    def choice(self, rng: random.Random) -> Any:
        return self.items[rng.randrange(len(self.items))]


def fill_social(feed: BenchFeed, records: int, users: int, seed: int = 7) -> Counter[str]:
    """``users`` user inserts, then the mix up to ``records`` records in all (one record per
    operation); returns the operations done."""
    rng = random.Random(seed)
    done: Counter[str] = Counter()
    for user_id in range(1, users + 1):
        feed.upsert_user(user_id, f"user{user_id}", f"User {user_id}", f"bio of user {user_id}")
    done["user"] = users
    posts, follows = Picker(), Picker()
    kinds, weights = zip(*MIX, strict=True)
    while feed.records < records:
        [kind] = rng.choices(kinds, weights)
        if kind in ("edit", "delete") and not posts:
            kind = "post"
        if kind == "unfollow" and not follows:
            kind = "follow"
        if kind == "rename":
            user_id = rng.randrange(1, users + 1)
            feed.upsert_user(
                user_id, f"user{user_id}", f"Renamed {rng.randrange(10**6)}", "renamed"
            )
        elif kind == "post":
            posts.add(feed.create_post(rng.randrange(1, users + 1)))
        elif kind == "edit":
            feed.edit_post(posts.choice(rng))
        elif kind == "delete":
            post_id = posts.choice(rng)
            feed.delete_post(post_id)
            posts.remove(post_id)
        elif kind == "follow":
            edge = (rng.randrange(1, users + 1), rng.randrange(1, users + 1))
            if edge[0] == edge[1] or edge in follows:
                continue
            feed.follow(*edge)
            follows.add(edge)
        else:
            edge = follows.choice(rng)
            feed.unfollow(*edge)
            follows.remove(edge)
        done[kind] += 1
    feed.flush()
    return done


def expected_profiles(state: SocialState) -> dict[int, dict[str, Any]]:
    """:func:`examples.social.views.reference.expected_profiles` in linear time."""
    followers = Counter(b for _, b in state.follows)
    following = Counter(a for a, _ in state.follows)
    posts = Counter(p["author_id"] for p in state.posts.values())
    return {
        user_id: {
            "user_id": user_id,
            "handle": user["handle"],
            "display_name": user.get("display_name"),
            "bio": user.get("bio"),
            "followers": followers[user_id],
            "following": following[user_id],
            "posts": posts[user_id],
        }
        for user_id, user in state.users.items()
    }
