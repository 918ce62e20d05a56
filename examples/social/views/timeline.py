"""The home timeline (PostgreSQL read model): for each user the newest 100 live posts by the
users they follow, newest first - the ``follows ⋈ posts`` join, maintained incrementally.

The store holds the live posts and follow edges (position-guarded entities); after each
batch's writes, in the same transaction, the timelines of exactly the users the batch could
have changed are recomputed by one set-based statement: the followers of every author whose
post was created, edited or deleted, and every user whose own follow edges changed. So a
follow back-fills the followee's newest posts, an unfollow removes them, a delete removes
the post from every timeline, an edit shows the new text, and a timeline never holds more
than :data:`LENGTH` posts.
"""

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from connectors.errors import StoreError, StoreUnavailableError
from connectors.stores.pg_tables import TypedColumn, TypedTable
from connectors.stores.postgres import PostgresStore, TableAccess
from examples.social.views.entities import FOLLOWS, FORGOTTEN, POSTS
from examples.social.views.forgetting import forgotten_users, purge_user
from examples.social.views.keys import key_options
from projections.view import Query, QueryParam, View, per_partition
from tributary.view_model import Applied, Put
from tributary.view_store import Collection, StoreTxn

NAME = "timeline"
TIMELINE = "timeline"
LENGTH = 100
COLUMNS = (
    TypedColumn("user_id", "bigint"),
    TypedColumn("post_id", "bigint"),
    TypedColumn("author_id", "bigint"),
    TypedColumn("text", "text"),
    TypedColumn("hashtags", "text[]", "json_array"),
    TypedColumn("created_at", "timestamptz"),
    TypedColumn("edited_at", "timestamptz"),
)


def timeline_table(table: str = "timeline") -> TypedTable:
    return TypedTable(TIMELINE, table, COLUMNS, ("user_id", "post_id"))


def affected_users(access: TableAccess, applied: Sequence[Applied]) -> list[int]:
    """Users whose timeline this batch can change."""
    users: set[int] = set()
    authors: set[str] = set()
    for change in applied:
        write = change.write
        values = [write.fields] if isinstance(write, Put) else []
        if change.before is not None:
            values.append(change.before)
        for fields in values:
            if write.collection == FOLLOWS and fields.get("follower_id") is not None:
                users.add(int(fields["follower_id"]))
            if write.collection == POSTS and fields.get("author_id") is not None:
                authors.add(str(fields["author_id"]))
    if authors:
        rows = access.conn.execute(
            sql.SQL(
                "SELECT DISTINCT (fields ->> 'follower_id')::bigint FROM {}"
                " WHERE fields ->> 'followee_id' = ANY(%s)"
            ).format(access.table_sql(FOLLOWS)),
            (sorted(authors),),
        ).fetchall()
        users.update(int(r[0]) for r in rows)
    return sorted(users)


def rebuild_timelines(txn: StoreTxn, applied: Sequence[Applied]) -> None:
    """Recompute the timelines of the affected users from the follows and posts held."""
    if not isinstance(txn, TableAccess):
        raise StoreError("the timeline view runs on the PostgreSQL store")
    forgotten = forgotten_users(applied)
    purged: set[int] = {int(u) for u in forgotten}
    for user_id in forgotten:  # their followers' timelines lose their posts; theirs goes
        purged |= {int(u) for u in purge_user(txn, user_id, (FOLLOWS, POSTS))}
    users = sorted(set(affected_users(txn, applied)) | purged)
    if not users:
        return
    timeline = txn.table_sql(TIMELINE)
    txn.conn.execute(sql.SQL("DELETE FROM {} WHERE user_id = ANY(%s)").format(timeline), (users,))
    txn.conn.execute(
        sql.SQL(
            "INSERT INTO {timeline} (user_id, post_id, author_id, text, hashtags, created_at,"
            " edited_at, _position, _applied_count)"
            " SELECT user_id, post_id, author_id, text, hashtags, created_at, edited_at, 0, 0"
            " FROM (SELECT u.user_id, (p.fields ->> 'post_id')::bigint AS post_id,"
            " (p.fields ->> 'author_id')::bigint AS author_id, p.fields ->> 'text' AS text,"
            " ARRAY(SELECT jsonb_array_elements_text(p.fields -> 'hashtags')) AS hashtags,"
            " (p.fields ->> 'created_at')::timestamptz AS created_at,"
            " (p.fields ->> 'edited_at')::timestamptz AS edited_at,"
            " row_number() OVER (PARTITION BY u.user_id ORDER BY"
            " (p.fields ->> 'created_at')::timestamptz DESC,"
            " (p.fields ->> 'post_id')::bigint DESC) AS rank"
            " FROM unnest(%s::bigint[]) AS u(user_id)"
            " JOIN {follows} f ON f.fields ->> 'follower_id' = u.user_id::text"
            " JOIN {posts} p ON p.fields ->> 'author_id' = f.fields ->> 'followee_id') ranked"
            " WHERE rank <= {length}"
        ).format(
            timeline=timeline,
            follows=txn.table_sql(FOLLOWS),
            posts=txn.table_sql(POSTS),
            length=sql.Literal(LENGTH),
        ),
        (users,),
    )


def timeline_view(
    dsn: str,
    schema: str,
    topics: tuple[str, ...],
    name: str = NAME,
    *,
    read_dsn: str | None = None,
    registry_url: str,
    keys: tuple[str, str] | None = None,
) -> View:
    """The timeline view: its store writes through ``dsn``; its query reads through
    ``read_dsn`` (the views' read-only role; default ``dsn``)."""
    query_dsn = read_dsn or dsn
    store = PostgresStore(
        dsn,
        schema,
        name,
        (
            Collection(POSTS, lookups=("author_id",)),
            Collection(FOLLOWS, lookups=("follower_id", "followee_id")),
            Collection(FORGOTTEN),
            timeline_table(),
        ),
        rebuild_timelines,
    )

    def timeline(user_id: int, limit: int = 20) -> list[dict[str, Any]]:
        try:
            with psycopg.connect(query_dsn, connect_timeout=5) as conn:
                found = conn.execute(
                    sql.SQL(
                        "SELECT post_id, author_id, text, hashtags, created_at, edited_at"
                        " FROM {} WHERE user_id = %s ORDER BY created_at DESC, post_id DESC"
                        " LIMIT %s"
                    ).format(sql.Identifier(schema, "timeline")),
                    (user_id, limit),
                ).fetchall()
        except psycopg.errors.UndefinedTable:
            return []
        except psycopg.errors.InsufficientPrivilege as exc:
            raise StoreUnavailableError(
                f"timeline store: the read role cannot read {schema}.timeline ({exc}); run"
                f" `tributary grant-read-role ROLE` for the role of TRIBUTARY_VIEWS_READ_URL"
            ) from exc
        except psycopg.OperationalError as exc:
            raise StoreUnavailableError(f"timeline store unreachable: {exc}") from exc
        return [
            {
                "post_id": r[0],
                "author_id": r[1],
                "text": r[2],
                "hashtags": list(r[3] or []),
                "created_at": r[4].isoformat(),
                "edited_at": None if r[5] is None else r[5].isoformat(),
            }
            for r in found
        ]

    return View(
        name=name,
        topics=topics,
        fold=per_partition(
            "examples.social.views.folds:fold_timeline", registry=registry_url, **key_options(keys)
        ),
        store=store,
        description=f"each user's newest {LENGTH} posts by the users they follow (PostgreSQL)",
        queries=(
            Query(
                "timeline",
                "/timeline/{user_id}",
                (
                    QueryParam("user_id", int, where="path", required=True, minimum=1),
                    QueryParam("limit", int, default=20, minimum=1, maximum=LENGTH),
                ),
                timeline,
                "A user's home timeline: newest posts by the users they follow.",
            ),
        ),
    )
