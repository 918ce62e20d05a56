"""The demo's social network: users (a CRUD table), posts and follows (event-sourced)."""

from sqlalchemy import Connection

from examples.social.domain import social_registry
from examples.social.follows import (
    Following,
    FollowUser,
    UnfollowUser,
    UserFollowed,
    UserUnfollowed,
)
from examples.social.posts import (
    CreatePost,
    DeletePost,
    EditPost,
    LikePost,
    Post,
    PostCreated,
    PostDeleted,
    PostEdited,
    PostLiked,
    hashtags,
)
from examples.social.users import create_users_table, upsert_user, users_table

__all__ = [
    "CreatePost",
    "DeletePost",
    "EditPost",
    "FollowUser",
    "Following",
    "LikePost",
    "Post",
    "PostCreated",
    "PostDeleted",
    "PostEdited",
    "PostLiked",
    "UnfollowUser",
    "UserFollowed",
    "UserUnfollowed",
    "create_users_table",
    "hashtags",
    "prepare_database",
    "social_registry",
    "upsert_user",
    "users_table",
]


def prepare_database(connection: Connection) -> None:
    """Create the demo's CRUD table (the processor calls this hook before it starts)."""
    create_users_table(connection)
