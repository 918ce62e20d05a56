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


def check_search(view: View, dsn: str, event_store: str) -> Check:
    def check() -> list[str]:
        expected = expected_search(source_of_truth(dsn, event_store))
        actual = {
            int(e.key): {k: e.fields.get(k) for k in SEARCH_FIELDS}
            for e in view.store.scan("posts")
        }
        return differences(f"{view.name} documents", expected, actual)

    return check


def check_profiles(view: View, dsn: str, event_store: str) -> Check:
    def check() -> list[str]:
        expected = expected_profiles(source_of_truth(dsn, event_store))
        actual = {int(e.key): dict(e.fields) for e in view.store.scan("profiles")}
        return differences(f"{view.name} profiles", expected, actual)

    return check


def check_timelines(view: View, dsn: str, views_schema: str, event_store: str) -> Check:
    def check() -> list[str]:
        expected = expected_timelines(source_of_truth(dsn, event_store))
        try:
            with psycopg.connect(dsn) as conn:
                rows = conn.execute(
                    sql.SQL(
                        "SELECT user_id, post_id FROM {} ORDER BY user_id, created_at DESC,"
                        " post_id DESC"
                    ).format(sql.Identifier(views_schema, "timeline"))
                ).fetchall()
        except psycopg.errors.UndefinedTable:
            rows = []
        actual: dict[int, list[int]] = {}
        for user_id, post_id in rows:
            actual.setdefault(int(user_id), []).append(int(post_id))
        return differences(f"{view.name} timelines", expected, actual)

    return check
