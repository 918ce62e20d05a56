"""Purging forgotten users from the social views' stores (inside each batch's atomic unit).

A ``SubjectForgotten`` event folds into an entry of the ``forgotten`` collection; the
materializer of each view calls :func:`forgotten_users` and :func:`purge_user` before its own
work in the same batch, so the user is gone from the view in the batch that carries the
event: their user entry, their posts and every follow edge that names them. Events that
name a forgotten user and arrive later (a replay from offset zero, a redelivery) fold into
removals (:mod:`examples.social.views.folds`), so nothing brings the user back.
"""

from collections.abc import Sequence

from examples.social.views.entities import FOLLOWS, FORGOTTEN, POSTS, USER, USERS
from tributary.view_model import Applied, Put
from tributary.view_store import StoreTxn


def forgotten_users(applied: Sequence[Applied]) -> list[str]:
    """The user ids (text) this batch forgot."""
    out = set()
    for change in applied:
        write = change.write
        is_user = isinstance(write, Put) and write.fields.get("subject_type") == USER
        if write.collection == FORGOTTEN and is_user:
            assert isinstance(write, Put)
            out.add(str(write.fields["subject_id"]))
    return sorted(out)


def purge_user(txn: StoreTxn, user_id: str, collections: Sequence[str]) -> set[str]:
    """Delete the user's entry, posts and follow edges from the ``collections`` the view
    holds; the other users whose follow edges were removed (their counts or timelines
    change)."""
    others: set[str] = set()
    if USERS in collections and txn.get(USERS, user_id) is not None:
        txn.delete(USERS, user_id)
    if POSTS in collections:
        for entry in txn.find(POSTS, "author_id", user_id):
            txn.delete(POSTS, entry.key)
    if FOLLOWS in collections:
        edges = {
            e.key: e
            for field in ("follower_id", "followee_id")
            for e in txn.find(FOLLOWS, field, user_id)
        }
        for key, entry in sorted(edges.items()):
            for field in ("follower_id", "followee_id"):
                if str(entry.fields.get(field)) != user_id:
                    others.add(str(entry.fields.get(field)))
            txn.delete(FOLLOWS, key)
    return others
