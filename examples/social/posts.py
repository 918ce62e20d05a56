"""Posts, event-sourced: created, edited, deleted, liked. Every event but a like carries hashtags
and creation time; a like names the post's author, the user who liked it and when.

An early release stored ``PostPublished`` v1 (no hashtags, ``published_at``); the upcaster in
:data:`POST_UPCASTERS` turns it into today's ``PostCreated`` v2 on read, so the old rows
stay untouched.

Personal data (:mod:`event_store.personal`): a post's ``text`` belongs to its author
(``user``, ``author_id``) and is stored and published encrypted with the author's key.
Ids, hashtags and times stay readable (hashtags feed the trending analytics).
"""

import re
from dataclasses import dataclass, field, replace
from datetime import datetime

from event_store import Aggregate, Command, CommandRejected, Event, Upcasters
from event_store.event import JsonObject
from event_store.personal import personal

MAX_TEXT = 500
_HASHTAG = re.compile(r"#(\w+)")


def hashtags(text: str) -> tuple[str, ...]:
    """Distinct hashtags of ``text``, lower-cased, in order of first use."""
    return tuple(dict.fromkeys(tag.lower() for tag in _HASHTAG.findall(text)))


def check_text(text: str) -> None:
    if not text.strip():
        raise CommandRejected("post text is empty")
    if len(text) > MAX_TEXT:
        raise CommandRejected(f"post text has {len(text)} characters; the limit is {MAX_TEXT}")


# -- commands ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CreatePost(Command):
    post_id: int
    author_id: int
    text: str


@dataclass(frozen=True)
class EditPost(Command):
    post_id: int
    text: str


@dataclass(frozen=True)
class DeletePost(Command):
    post_id: int


@dataclass(frozen=True)
class LikePost(Command):
    post_id: int
    user_id: int


# -- events -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PostCreated(Event, name="PostCreated", version=2):
    """A post was written: its text, the hashtags in it, when."""

    post_id: int
    author_id: int
    text: str = field(metadata=personal("user", "author_id"))
    hashtags: tuple[str, ...]
    created_at: datetime


@dataclass(frozen=True)
class PostEdited(Event, name="PostEdited"):
    """A post's text was replaced (hashtags and creation time repeated for readers)."""

    post_id: int
    author_id: int
    text: str = field(metadata=personal("user", "author_id"))
    hashtags: tuple[str, ...]
    created_at: datetime
    edited_at: datetime


@dataclass(frozen=True)
class PostDeleted(Event, name="PostDeleted"):
    """A post was deleted (its author, hashtags and creation time repeated for readers)."""

    post_id: int
    author_id: int
    hashtags: tuple[str, ...]
    created_at: datetime
    deleted_at: datetime


@dataclass(frozen=True)
class PostLiked(Event, name="PostLiked"):
    """A user liked a post."""

    post_id: int
    author_id: int = field(metadata={"doc": "The post's author."})
    user_id: int = field(metadata={"doc": "Who liked it."})
    liked_at: datetime


POST_EVENTS: list[type[Event]] = [PostCreated, PostEdited, PostDeleted, PostLiked]


def _published_v1_to_created_v2(data: JsonObject) -> JsonObject:
    return {
        "post_id": data["post_id"],
        "author_id": data["author_id"],
        "text": data["text"],
        "hashtags": list(hashtags(data["text"])),
        "created_at": data["published_at"],
    }


POST_UPCASTERS = Upcasters()
POST_UPCASTERS.register("PostPublished", 1, "PostCreated", 2, _published_v1_to_created_v2)


# -- aggregate --------------------------------------------------------------------------


@dataclass(frozen=True)
class PostState:
    created: bool = False
    deleted: bool = False
    author_id: int = 0
    text: str = ""
    hashtags: tuple[str, ...] = ()
    created_at: datetime | None = None
    likers: frozenset[int] = frozenset()


class Post(Aggregate[PostState]):
    """One post's stream, ``post-<post_id>``."""

    stream_type = "post"
    snapshot_version = 2  # 2: PostState.likers

    @classmethod
    def initial_state(cls) -> PostState:
        return PostState()

    @classmethod
    def evolve(cls, state: PostState, event: Event) -> PostState:
        match event:
            case PostCreated():
                return PostState(
                    True, False, event.author_id, event.text, event.hashtags, event.created_at
                )
            case PostEdited():
                return replace(state, text=event.text, hashtags=event.hashtags)
            case PostDeleted():
                return replace(state, deleted=True)
            case PostLiked():
                return replace(state, likers=state.likers | {event.user_id})
        return state

    def create(self, post_id: int, author_id: int, text: str, now: datetime) -> None:
        if self.state.created:
            raise CommandRejected(f"post {post_id} already exists")
        check_text(text)
        self.record(PostCreated(post_id, author_id, text, hashtags(text), now))

    def edit(self, post_id: int, text: str, now: datetime) -> None:
        created_at = self._live(post_id, "edit")
        check_text(text)
        tags = hashtags(text)
        self.record(PostEdited(post_id, self.state.author_id, text, tags, created_at, now))

    def delete(self, post_id: int, now: datetime) -> None:
        created_at = self._live(post_id, "delete")
        s = self.state
        self.record(PostDeleted(post_id, s.author_id, s.hashtags, created_at, now))

    def like(self, post_id: int, user_id: int, now: datetime) -> None:
        self._live(post_id, "like")
        if user_id in self.state.likers:
            raise CommandRejected(f"user {user_id} already likes post {post_id}")
        self.record(PostLiked(post_id, self.state.author_id, user_id, now))

    def _live(self, post_id: int, verb: str) -> datetime:
        if not self.state.created or self.state.created_at is None:
            raise CommandRejected(f"cannot {verb} post {post_id}: it does not exist")
        if self.state.deleted:
            raise CommandRejected(f"cannot {verb} post {post_id}: it was deleted")
        return self.state.created_at


def post_stream(post_id: int) -> str:
    return f"post-{post_id}"
