"""The profile cache (Redis): ``profile:{user_id}`` with handle, display name, bio and the
counts of followers, followees and live posts.

Counts are recounted from the store's own entity entries (follow edges, live posts) for every
user a batch touched, in the batch's atomic unit: a redelivered or replayed event is stopped
by the position guard before it reaches the counts, and a recount of what is held is the same
however often it runs, so no increment is ever applied twice. A deleted user's key goes away.
"""

from collections.abc import Sequence
from typing import Any

from connectors.stores.redis import RedisStore
from examples.social.views.entities import FOLLOWS, FORGOTTEN, POSTS, USERS
from examples.social.views.forgetting import forgotten_users, purge_user
from examples.social.views.keys import key_options
from projections.view import Query, QueryParam, View, per_partition
from tributary.view_model import Applied, Put
from tributary.view_store import Collection, StoreTxn

NAME = "profile"
PROFILES = "profiles"
COLLECTIONS = (
    Collection(USERS),
    Collection(FOLLOWS, lookups=("follower_id", "followee_id")),
    Collection(POSTS, lookups=("author_id",)),
    Collection(PROFILES),
    Collection(FORGOTTEN),
)


def _users_touched(change: Applied) -> set[str]:
    write = change.write
    fields: list[Any] = []
    if isinstance(write, Put):
        fields.append(write.fields)
    if change.before is not None:
        fields.append(change.before)
    if write.collection == USERS:
        return {write.key}
    out: set[str] = set()
    for values in fields:
        for name in ("follower_id", "followee_id", "author_id"):
            if values.get(name) is not None:
                out.add(str(values[name]))
    return out


def count_profiles(txn: StoreTxn, applied: Sequence[Applied]) -> None:
    """Rebuild ``profile:{id}`` of every user this batch touched."""
    touched: set[str] = set()
    for user_id in forgotten_users(applied):
        touched |= purge_user(txn, user_id, (USERS, FOLLOWS, POSTS))
        touched.add(user_id)
    for change in applied:
        if change.write.collection not in (PROFILES, FORGOTTEN):
            touched |= _users_touched(change)
    for user_id in sorted(touched, key=lambda u: (len(u), u)):
        user = txn.get(USERS, user_id)
        if user is None:
            txn.delete(PROFILES, user_id)
            continue
        txn.put(
            PROFILES,
            user_id,
            {
                "user_id": int(user_id),
                "handle": user.fields.get("handle"),
                "display_name": user.fields.get("display_name"),
                "bio": user.fields.get("bio"),
                "followers": txn.count(FOLLOWS, "followee_id", user_id),
                "following": txn.count(FOLLOWS, "follower_id", user_id),
                "posts": txn.count(POSTS, "author_id", user_id),
            },
        )


def profile_view(
    redis_url: str,
    topics: tuple[str, ...],
    name: str = NAME,
    key_format: str = "profile:{key}",
    *,
    registry_url: str,
    keys: tuple[str, str] | None = None,
) -> View:
    store = RedisStore(redis_url, name, COLLECTIONS, count_profiles, {PROFILES: key_format})

    def profile(user_id: int) -> dict[str, Any]:
        entry = store.get(PROFILES, str(user_id))
        if entry is None:
            raise LookupError(f"no profile for user {user_id}")
        return dict(entry.fields)

    return View(
        name=name,
        topics=topics,
        fold=per_partition(
            "examples.social.views.folds:fold_profile", registry=registry_url, **key_options(keys)
        ),
        store=store,
        description="profile:{user_id} in Redis: handle, display name, bio, follower, "
        "followee and post counts",
        queries=(
            Query(
                "profile",
                "/profile/{user_id}",
                (QueryParam("user_id", int, where="path", required=True, minimum=1),),
                profile,
                "A user's cached profile with follower, following and post counts.",
            ),
        ),
    )
