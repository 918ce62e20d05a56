"""The demo domain's decisions, without a database (aggregates are plain objects)."""

from datetime import UTC, datetime

import pytest

from event_store import CommandRejected
from examples.social import Following, Post, PostCreated, PostDeleted, PostEdited, hashtags
from examples.social.follows import UserFollowed, UserUnfollowed

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def test_hashtags_are_distinct_lower_case_in_order() -> None:
    assert hashtags("#Go and #rust, #GO! #r_2 x#y") == ("go", "rust", "r_2", "y")
    assert hashtags("no tags") == ()


def test_a_post_lives_and_dies() -> None:
    post = Post("post-1")
    post.create(1, 7, "hi #there", NOW)
    post.edit(1, "bye #now", NOW)
    post.delete(1, NOW)
    assert [type(e) for e in post.pending] == [PostCreated, PostEdited, PostDeleted]
    assert post.state.deleted and post.state.hashtags == ("now",)
    deleted = post.pending[-1]
    assert isinstance(deleted, PostDeleted)
    assert deleted.hashtags == ("now",) and deleted.created_at == NOW and deleted.author_id == 7


@pytest.mark.parametrize("text", ["", "  ", "x" * 501])
def test_bad_text_is_rejected(text: str) -> None:
    with pytest.raises(CommandRejected):
        Post("post-1").create(1, 7, text, NOW)
    assert Post("post-1").pending == ()


def test_exactly_500_characters_is_fine() -> None:
    post = Post("post-1")
    post.create(1, 7, "x" * 500, NOW)
    assert len(post.pending) == 1


def test_following_rules() -> None:
    following = Following("follows-1")
    with pytest.raises(CommandRejected, match="themselves"):
        following.follow(1, 1, NOW)
    following.follow(1, 2, NOW)
    with pytest.raises(CommandRejected, match="already"):
        following.follow(1, 2, NOW)
    following.unfollow(1, 2, NOW)
    with pytest.raises(CommandRejected, match="does not follow"):
        following.unfollow(1, 2, NOW)
    assert [type(e) for e in following.pending] == [UserFollowed, UserUnfollowed]


def test_replayed_state_equals_decided_state_and_snapshots_round_trip() -> None:
    decided = Post("post-1")
    decided.create(1, 7, "a #b", NOW)
    decided.edit(1, "c #d", NOW)
    replayed = Post("post-1")
    replayed.replay(decided.pending)
    assert replayed.state == decided.state and replayed.version == 2
    restored = Post.from_snapshot("post-1", 2, replayed.snapshot_state())
    assert restored.state == replayed.state and restored.version == 2
