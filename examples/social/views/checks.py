"""`tributary verify` for the social views: each view's store against what the source of truth
(the users table and the event store) says it must hold."""

from collections.abc import Callable

import psycopg
from psycopg import sql

from examples.social.views.reference import (
    differences,
    expected_profiles,
    expected_search,
    expected_timelines,
    source_of_truth,
)
from projections.view import View

Check = Callable[[], list[str]]
SEARCH_FIELDS = ("text", "hashtags", "author_handle", "author_name")
#: Entry fields that name a user, and the collections keyed by the user id.
USER_REFERENCES = ("author_id", "follower_id", "followee_id", "user_id")
KEYED_BY_USER = ("users", "profiles")


def forgotten_held(view: View, forgotten: set[int]) -> list[str]:
    """What ``view``'s store still holds of forgotten users: an entry keyed by one, or
    naming one (author, follower, followee). `tributary verify` reports each."""
    if not forgotten:
        return []
    store = view.store
    held = getattr(store, "collections", None) or getattr(store, "layouts", None) or {}
    names = set(held) & {"users", "posts", "follows", "profiles"}
    found: dict[int, list[str]] = {}
    for collection in sorted(names):
        for entry in view.store.scan(collection):
            users = {int(entry.key)} if collection in KEYED_BY_USER else set()
            for field in USER_REFERENCES:
                value = entry.fields.get(field)
                if value is not None and str(value).lstrip("-").isdigit():
                    users.add(int(value))
            for user in users & forgotten:
                found.setdefault(user, []).append(f"{collection} {entry.key}")
    return [
        f"{view.name} still holds forgotten user {user}: {', '.join(sorted(what)[:5])}"
        + (f" and {len(what) - 5} more" if len(what) > 5 else "")
        for user, what in sorted(found.items())
    ]


def check_search(view: View, dsn: str, event_store: str) -> Check:
    def check() -> list[str]:
        truth = source_of_truth(dsn, event_store)
        expected = expected_search(truth)
        actual = {
            int(e.key): {k: e.fields.get(k) for k in SEARCH_FIELDS}
            for e in view.store.scan("posts")
        }
        held = forgotten_held(view, truth.forgotten)
        return held + differences(f"{view.name} documents", expected, actual)

    return check


def check_profiles(view: View, dsn: str, event_store: str) -> Check:
    def check() -> list[str]:
        truth = source_of_truth(dsn, event_store)
        expected = expected_profiles(truth)
        actual = {int(e.key): dict(e.fields) for e in view.store.scan("profiles")}
        held = forgotten_held(view, truth.forgotten)
        return held + differences(f"{view.name} profiles", expected, actual)

    return check


def check_timelines(view: View, dsn: str, views_schema: str, event_store: str) -> Check:
    def check() -> list[str]:
        truth = source_of_truth(dsn, event_store)
        expected = expected_timelines(truth)
        try:
            with psycopg.connect(dsn) as conn:
                rows = conn.execute(
                    sql.SQL(
                        "SELECT user_id, post_id, author_id FROM {} ORDER BY user_id,"
                        " created_at DESC, post_id DESC"
                    ).format(sql.Identifier(views_schema, "timeline"))
                ).fetchall()
        except psycopg.errors.UndefinedTable:
            rows = []
        actual: dict[int, list[int]] = {}
        held: dict[int, int] = {}
        for user_id, post_id, author_id in rows:
            actual.setdefault(int(user_id), []).append(int(post_id))
            for user in {int(user_id), int(author_id)} & truth.forgotten:
                held[user] = held.get(user, 0) + 1
        found = [
            f"{view.name} still holds forgotten user {user}: {n} timeline rows"
            for user, n in sorted(held.items())
        ]
        found += forgotten_held(view, truth.forgotten)
        return found + differences(f"{view.name} timelines", expected, actual)

    return check
