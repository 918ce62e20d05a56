"""The search index (tantivy, BM25): one document per live post - text, hashtags, the author's
handle and display name, creation and edit time.

The author fields come from ``cdc.public.users``: a stream-table join kept current in the
store's atomic unit. A post written or re-written gets its author's fields; a user written or
deleted re-indexes every post of that user, so a rename shows in search within the batch that
carries it.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from connectors.stores.tantivy import SearchField, TantivyStore
from examples.social.views.entities import FORGOTTEN, POSTS, USERS
from examples.social.views.forgetting import forgotten_users, purge_user
from examples.social.views.keys import key_options
from projections.view import Query, QueryParam, View, per_partition
from tributary.view_model import Applied, Put
from tributary.view_store import Collection, StoreTxn

NAME = "search"
SEARCH_FIELDS = (
    SearchField("text"),
    SearchField("hashtags", "keyword"),
    SearchField("author_handle", "text", "default"),
    SearchField("author_name", "text", "default"),
    SearchField("created_at", "date"),
    SearchField("edited_at", "date"),
)
RANKED_BY = ("text", "hashtags", "author_handle", "author_name")
COLLECTIONS = (
    Collection(POSTS, lookups=("author_id",)),
    Collection(USERS),
    Collection(FORGOTTEN),
)


def join_authors(txn: StoreTxn, applied: Sequence[Applied]) -> None:
    """Give each post written in this batch, and each post of a user written in it, the
    author's current handle and display name (after purging the users it forgot)."""
    for user_id in forgotten_users(applied):
        purge_user(txn, user_id, (USERS, POSTS))
    posts: set[str] = set()
    for change in applied:
        write = change.write
        if write.collection == POSTS and isinstance(write, Put):
            posts.add(write.key)
        elif write.collection == USERS:
            posts.update(e.key for e in txn.find(POSTS, "author_id", write.key))
    for key in sorted(posts):
        post = txn.get(POSTS, key)
        if post is None:
            continue
        author = txn.get(USERS, str(post.fields["author_id"]))
        joined = {
            **post.fields,
            "author_handle": None if author is None else author.fields.get("handle"),
            "author_name": None if author is None else author.fields.get("display_name"),
        }
        if joined != post.fields:
            txn.put(POSTS, key, joined)


def hit(score: float, fields: dict[str, Any]) -> dict[str, Any]:
    return {
        "post_id": fields["post_id"],
        "author_id": fields["author_id"],
        "author_handle": fields.get("author_handle"),
        "author_name": fields.get("author_name"),
        "text": fields["text"],
        "hashtags": fields.get("hashtags", []),
        "created_at": fields.get("created_at"),
        "edited_at": fields.get("edited_at"),
        "score": round(score, 4),
    }


def search_view(
    index_root: Path,
    topics: tuple[str, ...],
    name: str = NAME,
    *,
    registry_url: str,
    keys: tuple[str, str] | None = None,
) -> View:
    """The search view; ``registry_url``: the schema registry events' schema ids refer to;
    ``keys``: (DSN, event store schema) of the subject keys that decrypt personal fields."""
    store = TantivyStore(index_root, name, COLLECTIONS, join_authors, search_fields=SEARCH_FIELDS)

    def search(q: str, limit: int = 10) -> list[dict[str, Any]]:
        found = store.search(q, RANKED_BY, collection=POSTS, limit=limit)
        return [hit(score, entry.fields) for score, entry in found]

    return View(
        name=name,
        topics=topics,
        fold=per_partition(
            "examples.social.views.folds:fold_search", registry=registry_url, **key_options(keys)
        ),
        store=store,
        description="full-text search over live posts, with their authors (tantivy, BM25)",
        queries=(
            Query(
                "search",
                "/search",
                (
                    QueryParam("q", str, required=True, description="words to search for"),
                    QueryParam("limit", int, default=10, minimum=1, maximum=100),
                ),
                search,
                "Live posts matching the words, best first (BM25 over text, hashtags, author).",
            ),
        ),
    )
