"""The demo's social network: users (a CRUD table), posts and follows (event-sourced)."""

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
    Post,
    PostCreated,
    PostDeleted,
    PostEdited,
    hashtags,
)
from examples.social.users import create_users_table, upsert_user, users_table

__all__ = [
    "CreatePost",
    "DeletePost",
    "EditPost",
    "FollowUser",
    "Following",
    "Post",
    "PostCreated",
    "PostDeleted",
    "PostEdited",
    "UnfollowUser",
    "UserFollowed",
    "UserUnfollowed",
    "create_users_table",
    "hashtags",
    "social_registry",
    "upsert_user",
    "users_table",
]
