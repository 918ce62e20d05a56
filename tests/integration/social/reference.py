"""What the social views must hold, computed independently from the source of truth.

The source of truth is the users table and the event store (or, for hand-fed tests, the
generator's own model of them): the live posts, the current follow edges, the users. The
views are compared with these plain computations - the home timeline with the SQL join of
current follows and live posts.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from examples.social.views.timeline import LENGTH


@dataclass
class SocialState:
    users: dict[int, dict[str, Any]] = field(default_factory=dict)
    posts: dict[int, dict[str, Any]] = field(default_factory=dict)  # live posts only
    follows: set[tuple[int, int]] = field(default_factory=set)  # (follower, followee)


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
