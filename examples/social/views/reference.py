"""What the social views must hold, computed from the source of truth without any of the
views' code: the users table and the event store give the users, the live posts and the
current follow edges; the expected profiles, search documents and timelines are plain
computations over those (the timeline also as the SQL join of follows and posts).

`tributary verify` compares the live views with these, and so do the tests.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from event_store.personal import decrypt
from examples.social.views.timeline import LENGTH


@dataclass
class SocialState:
    users: dict[int, dict[str, Any]] = field(default_factory=dict)
    posts: dict[int, dict[str, Any]] = field(default_factory=dict)  # live posts only
    follows: set[tuple[int, int]] = field(default_factory=set)  # (follower, followee)
    forgotten: set[int] = field(default_factory=set)  # users forgotten: in no view

    def forget(self, user_id: int) -> None:
        """What the views hold once ``user_id`` is forgotten: no user entry, none of their
        posts, no follow edge naming them."""
        self.forgotten.add(user_id)
        self.users.pop(user_id, None)
        self.posts = {k: p for k, p in self.posts.items() if p["author_id"] != user_id}
        self.follows = {(a, b) for a, b in self.follows if user_id not in (a, b)}


def expected_profiles(state: SocialState) -> dict[int, dict[str, Any]]:
    return {
        user_id: {
            "user_id": user_id,
            "handle": user["handle"],
            "display_name": user.get("display_name"),
            "bio": user.get("bio"),
            "followers": sum(1 for _, b in state.follows if b == user_id),
            "following": sum(1 for a, _ in state.follows if a == user_id),
            "posts": sum(1 for p in state.posts.values() if p["author_id"] == user_id),
        }
        for user_id, user in state.users.items()
    }


def expected_search(state: SocialState) -> dict[int, dict[str, Any]]:
    out = {}
    for post_id, post in state.posts.items():
        author = state.users.get(post["author_id"])
        out[post_id] = {
            "text": post["text"],
            "hashtags": list(post["hashtags"]),
            "author_handle": None if author is None else author["handle"],
            "author_name": None if author is None else author.get("display_name"),
        }
    return out


def expected_timelines(state: SocialState) -> dict[int, list[int]]:
    """Per user with a non-empty timeline: the newest ``LENGTH`` post ids by followees."""
    out: dict[int, list[int]] = {}
    followers = {a for a, _ in state.follows}
    for user in followers:
        followees = {b for a, b in state.follows if a == user}
        posts = [p for p in state.posts.values() if p["author_id"] in followees]
        posts.sort(key=lambda p: (_when(p["created_at"]), p["post_id"]), reverse=True)
        if posts:
            out[user] = [p["post_id"] for p in posts[:LENGTH]]
    return out


def _when(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def timelines_by_sql(
    dsn: str, posts: Iterable[dict[str, Any]], follows: set[tuple[int, int]]
) -> dict[int, list[int]]:
    """The same reference computed by PostgreSQL: the join of current follows and live posts."""
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "CREATE TEMP TABLE ref_posts (post_id bigint, author_id bigint, created_at timestamptz)"
        )
        conn.execute("CREATE TEMP TABLE ref_follows (follower bigint, followee bigint)")
        with conn.cursor() as cur:
            with cur.copy("COPY ref_posts FROM STDIN") as copy:
                for p in posts:
                    copy.write_row((p["post_id"], p["author_id"], _when(p["created_at"])))
            with cur.copy("COPY ref_follows FROM STDIN") as copy:
                for a, b in follows:
                    copy.write_row((a, b))
        rows = conn.execute(
            "SELECT follower, post_id FROM (SELECT f.follower, p.post_id, row_number() OVER"
            " (PARTITION BY f.follower ORDER BY p.created_at DESC, p.post_id DESC) AS rank"
            " FROM ref_follows f JOIN ref_posts p ON p.author_id = f.followee) r"
            f" WHERE rank <= {LENGTH} ORDER BY follower, rank"
        ).fetchall()
    out: dict[int, list[int]] = {}
    for follower, post_id in rows:
        out.setdefault(int(follower), []).append(int(post_id))
    return out


def source_of_truth(dsn: str, event_store_schema: str = "event_store") -> SocialState:
    """Users from the CRUD table; live posts and follow edges folded from the event store
    (posts' text decrypted with the subject keys); forgotten users taken out."""
    state = SocialState()
    with psycopg.connect(dsn) as conn:
        for user_id, handle, name, bio in conn.execute(
            "SELECT id, handle, display_name, bio FROM public.users"
        ).fetchall():
            state.users[int(user_id)] = {"handle": handle, "display_name": name, "bio": bio}
        events = conn.execute(
            sql.SQL(
                "SELECT event_type, schema_version, data FROM {} ORDER BY stream_id, version"
            ).format(sql.Identifier(event_store_schema, "events"))
        ).fetchall()
        try:
            keys = {
                (str(t), str(i)): None if k is None else bytes(k)
                for t, i, k in conn.execute(
                    sql.SQL("SELECT subject_type, subject_id, key FROM {}").format(
                        sql.Identifier(event_store_schema, "subject_keys")
                    )
                ).fetchall()
            }
        except psycopg.errors.UndefinedTable:
            keys = {}
    for event_type, schema_version, data in events:
        if event_type in ("PostCreated", "PostEdited") and str(data["text"]).startswith("tx1:"):
            author = ("user", str(data["author_id"]))
            key = keys.get(author)
            data = {
                **data,
                "text": "[forgotten]"
                if key is None
                else decrypt(key, data["text"], author, "text"),
            }
        if event_type == "PostPublished" and schema_version == 1:  # the v1 shape, upcast
            event_type = "PostCreated"
            data = {**data, "created_at": data["published_at"], "hashtags": []}
        if event_type in ("PostCreated", "PostEdited"):
            state.posts[int(data["post_id"])] = {**data, "edited_at": data.get("edited_at")}
        elif event_type == "PostDeleted":
            state.posts.pop(int(data["post_id"]), None)
        elif event_type == "UserFollowed":
            state.follows.add((int(data["follower_id"]), int(data["followee_id"])))
        elif event_type == "UserUnfollowed":
            state.follows.discard((int(data["follower_id"]), int(data["followee_id"])))
    for (kind, subject_id), key in keys.items():
        if kind == "user" and key is None:
            state.forget(int(subject_id))
    return state


def differences(name: str, expected: dict[Any, Any], actual: dict[Any, Any]) -> list[str]:
    """Readable differences between two keyed states (at most a few of each kind)."""
    out: list[str] = []
    missing = [k for k in expected if k not in actual]
    extra = [k for k in actual if k not in expected]
    wrong = [k for k in expected if k in actual and expected[k] != actual[k]]
    for label, keys in (("missing", missing), ("unexpected", extra), ("different", wrong)):
        if keys:
            shown = ", ".join(str(k) for k in sorted(keys, key=str)[:5])
            out.append(f"{name}: {len(keys)} {label} ({shown}{', ...' if len(keys) > 5 else ''})")
    return out
