"""The social domain's command registry: commands → aggregates, with the users-table checks."""

from functools import cache
from typing import TYPE_CHECKING

from event_store import CommandRegistry, CommandRejected, EventCodec, EventRegistry, Read
from event_store import HandlerContext as Ctx
from examples.social.follows import (
    FOLLOW_EVENTS,
    Following,
    FollowUser,
    UnfollowUser,
    follows_stream,
)
from examples.social.posts import (
    POST_EVENTS,
    POST_UPCASTERS,
    CreatePost,
    DeletePost,
    EditPost,
    LikePost,
    Post,
    post_stream,
)

if TYPE_CHECKING:
    from sqlalchemy import Table


def social_registry(users: "Table | None" = None) -> CommandRegistry:
    """Handlers for posts and follows; ``users`` is the CRUD table authors must exist in.

    The users-table check's SQL is compiled at the first handler that needs it: a registry
    used only to route commands (`tributary command` keys each by its stream) does without
    SQLAlchemy and the driver (~0.4 s of imports)."""
    codec = EventCodec(EventRegistry([*POST_EVENTS, *FOLLOW_EVENTS]), POST_UPCASTERS)
    registry = CommandRegistry(codec)

    @cache
    def exists() -> str:
        from examples.social.users import user_exists_sql, users_table

        return user_exists_sql(users_table() if users is None else users)

    def user(user_id: int) -> Read:
        return Read(exists(), {"user_id": user_id})

    def require_user(ctx: Ctx, read: str, user_id: int, role: str) -> None:
        # The users-table check rode along with the load (the route's reads): no round trip.
        if ctx.reads[read] is None:
            raise CommandRejected(f"unknown {role}: no user {user_id}")

    @registry.handler(
        CreatePost,
        Post,
        stream=lambda c: post_stream(c.post_id),
        reads=lambda c: {"author": user(c.author_id)},
    )
    def create_post(post: Post, c: CreatePost, ctx: Ctx) -> None:
        require_user(ctx, "author", c.author_id, "author")
        post.create(c.post_id, c.author_id, c.text, ctx.now)

    @registry.handler(EditPost, Post, stream=lambda c: post_stream(c.post_id))
    def edit_post(post: Post, c: EditPost, ctx: Ctx) -> None:
        post.edit(c.post_id, c.text, ctx.now)

    @registry.handler(DeletePost, Post, stream=lambda c: post_stream(c.post_id))
    def delete_post(post: Post, c: DeletePost, ctx: Ctx) -> None:
        post.delete(c.post_id, ctx.now)

    @registry.handler(
        LikePost,
        Post,
        stream=lambda c: post_stream(c.post_id),
        reads=lambda c: {"liker": user(c.user_id)},
    )
    def like_post(post: Post, c: LikePost, ctx: Ctx) -> None:
        require_user(ctx, "liker", c.user_id, "user")
        post.like(c.post_id, c.user_id, ctx.now)

    @registry.handler(
        FollowUser,
        Following,
        stream=lambda c: follows_stream(c.follower_id),
        reads=lambda c: {"follower": user(c.follower_id), "followee": user(c.followee_id)},
    )
    def follow(following: Following, c: FollowUser, ctx: Ctx) -> None:
        if c.follower_id != c.followee_id:
            require_user(ctx, "follower", c.follower_id, "follower")
            require_user(ctx, "followee", c.followee_id, "followee")
        following.follow(c.follower_id, c.followee_id, ctx.now)

    @registry.handler(UnfollowUser, Following, stream=lambda c: follows_stream(c.follower_id))
    def unfollow(following: Following, c: UnfollowUser, ctx: Ctx) -> None:
        following.unfollow(c.follower_id, c.followee_id, ctx.now)

    return registry
