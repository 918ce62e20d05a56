"""Follows, event-sourced: one stream per follower, ``follows-<follower_id>``."""

from dataclasses import dataclass
from datetime import datetime

from event_store import Aggregate, Command, CommandRejected, Event


@dataclass(frozen=True)
class FollowUser(Command):
    follower_id: int
    followee_id: int


@dataclass(frozen=True)
class UnfollowUser(Command):
    follower_id: int
    followee_id: int


@dataclass(frozen=True)
class UserFollowed(Event, name="UserFollowed"):
    """``follower_id`` now follows ``followee_id``."""

    follower_id: int
    followee_id: int
    followed_at: datetime


@dataclass(frozen=True)
class UserUnfollowed(Event, name="UserUnfollowed"):
    """``follower_id`` no longer follows ``followee_id``."""

    follower_id: int
    followee_id: int
    unfollowed_at: datetime


FOLLOW_EVENTS: list[type[Event]] = [UserFollowed, UserUnfollowed]


@dataclass(frozen=True)
class FollowingState:
    followees: frozenset[int] = frozenset()


class Following(Aggregate[FollowingState]):
    """Whom one user follows."""

    stream_type = "follows"

    @classmethod
    def initial_state(cls) -> FollowingState:
        return FollowingState()

    @classmethod
    def evolve(cls, state: FollowingState, event: Event) -> FollowingState:
        match event:
            case UserFollowed():
                return FollowingState(state.followees | {event.followee_id})
            case UserUnfollowed():
                return FollowingState(state.followees - {event.followee_id})
        return state

    def follow(self, follower_id: int, followee_id: int, now: datetime) -> None:
        if follower_id == followee_id:
            raise CommandRejected(f"user {follower_id} cannot follow themselves")
        if followee_id in self.state.followees:
            raise CommandRejected(f"user {follower_id} already follows user {followee_id}")
        self.record(UserFollowed(follower_id, followee_id, now))

    def unfollow(self, follower_id: int, followee_id: int, now: datetime) -> None:
        if followee_id not in self.state.followees:
            raise CommandRejected(f"user {follower_id} does not follow user {followee_id}")
        self.record(UserUnfollowed(follower_id, followee_id, now))


def follows_stream(follower_id: int) -> str:
    return f"follows-{follower_id}"
