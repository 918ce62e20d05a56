"""The demo's social network: users (a CRUD table), posts and follows (event-sourced).

The names are loaded on first use (PEP 562): the CLI plug-in ``tributary activity`` lives in
this package, and every ``tributary`` command builds the CLI first.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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


_HOMES = {
    "social_registry": "domain",
    "Following": "follows",
    "FollowUser": "follows",
    "UnfollowUser": "follows",
    "UserFollowed": "follows",
    "UserUnfollowed": "follows",
    "CreatePost": "posts",
    "DeletePost": "posts",
    "EditPost": "posts",
    "LikePost": "posts",
    "Post": "posts",
    "PostCreated": "posts",
    "PostDeleted": "posts",
    "PostEdited": "posts",
    "PostLiked": "posts",
    "hashtags": "posts",
    "create_users_table": "users",
    "upsert_user": "users",
    "users_table": "users",
}


def prepare_database(connection: "Connection") -> None:
    """Create the demo's CRUD table (the processor calls this hook before it starts)."""
    from examples.social.users import create_users_table

    create_users_table(connection)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
