"""The analytics jobs' purge of forgotten users: the processors' pass-through rows and the
materializer every job with user ids shares (on an in-memory transaction)."""

import json
from collections.abc import Mapping
from typing import Any

import pandas as pd

from examples.social.analytics.common import forgetting
from examples.social.analytics.stateful import FORGOTTEN, LATE_INPUT, late_values, passing
from tributary.view_model import Applied, Entry, Put


class Txn:
    """A batch's atomic unit over dicts: collection -> key -> fields."""

    def __init__(self, entries: dict[str, dict[str, dict[str, Any]]]) -> None:
        self.entries = entries

    def get(self, collection: str, key: str) -> Entry | None:
        fields = self.entries.get(collection, {}).get(key)
        return None if fields is None else Entry(collection, key, fields, 1, 1)

    def find(self, collection: str, field: str, value: Any) -> list[Entry]:
        return [
            Entry(collection, k, f, 1, 1)
            for k, f in self.entries.get(collection, {}).items()
            if f.get(field) == value
        ]

    def count(self, collection: str, field: str, value: Any) -> int:
        return len(self.find(collection, field, value))

    def put(self, collection: str, key: str, fields: Mapping[str, Any]) -> None:
        self.entries.setdefault(collection, {})[key] = dict(fields)

    def delete(self, collection: str, key: str) -> None:
        self.entries.get(collection, {}).pop(key, None)


def put(collection: str, key: str, **fields: Any) -> Applied:
    return Applied(Put(collection, key, 1, fields))


HOLDERS = {"alerts": ("user_id", "other_id")}


def test_the_batch_that_forgets_a_user_deletes_every_entry_naming_them() -> None:
    txn = Txn(
        {
            "alerts": {
                "a": {"user_id": 7, "other_id": None},
                "b": {"user_id": 3, "other_id": 7},
                "c": {"user_id": 3, "other_id": 4},
            }
        }
    )
    forgotten = {"subject_type": "user", "user_id": 7}
    txn.put(FORGOTTEN, "7", forgotten)  # the batch's own write, as the store applied it
    forgetting(HOLDERS)(txn, [put(FORGOTTEN, "7", **forgotten)])
    assert txn.entries["alerts"] == {"c": {"user_id": 3, "other_id": 4}}


def test_a_later_entry_naming_a_forgotten_user_is_deleted_in_its_batch() -> None:
    txn = Txn({FORGOTTEN: {"7": {"subject_type": "user", "user_id": 7}}, "alerts": {}})
    applied = [
        put("alerts", "d", user_id=3, other_id=7),  # a follower's churn alert, later
        put("alerts", "e", user_id=3, other_id=4),
    ]
    for a in applied:
        assert isinstance(a.write, Put)
        txn.put("alerts", a.write.key, a.write.fields)
    forgetting(HOLDERS)(txn, applied)
    assert set(txn.entries["alerts"]) == {"e"}


def test_a_forgotten_users_row_passes_through_a_processor_as_its_entry() -> None:
    frame = pd.DataFrame(
        {
            "kind": ["search", FORGOTTEN],
            "user_id": [3, 7],
            "event_id": ["s1", "f1"],
            "beyond": [False, False],
            "error": [None, None],
            **{
                name: [None, None]
                for name in LATE_INPUT
                if name not in ("kind", "event_id", "beyond", "error")
            },
        }
    )
    assert passing(frame).tolist() == [False, True]
    [row] = late_values(frame, "sessions")
    assert (row["collection"], row["key"], row["position"]) == (FORGOTTEN, "7", 1)


def test_a_subject_forgotten_event_decodes_into_a_forgotten_users_row() -> None:
    from examples.social.analytics.inputs import _event_row

    def event(subject_type: str, subject_id: str) -> dict[str, Any]:
        return {
            "event_type": "SubjectForgotten",
            "event_id": "e1",
            "version": 1,
            "occurred_at": "2026-01-01T00:00:00+00:00",
            "data": {"subject_type": subject_type, "subject_id": subject_id},
        }

    row = _event_row(event("user", "42"))
    assert row == {"event_id": "e1", "version": 1, "kind": FORGOTTEN, "user_id": 42}
    assert "event_time" not in row  # no times: it moves no watermark, is never late
    assert _event_row(event("team", "42")) is None  # not one of the users
    assert _event_row(event("user", "abc")) is None


def test_a_late_entry_keeps_integer_times_beside_a_row_without_times() -> None:
    """A forgotten user's row has no times: pandas makes the group's time columns float, and
    the late entry must still read as the live run wrote it (a replay compares them)."""
    times = ("event_time", "sent_time", "received_time", "corrected_time", "delay_ms")
    frame = pd.DataFrame(
        {
            "kind": ["search", FORGOTTEN],
            "user_id": [3, 7],
            "event_id": ["s1", "f1"],
            "beyond": [True, False],
            "error": [None, None],
            **{name: [1_767_228_518_477, None] for name in times},
            "topic": ["activity", "subject"],
            "partition": [1, 0],
            "offset": [40, 3],
            "raw_key": [None, None],
            "raw_value": [None, None],
        }
    )
    assert frame["event_time"].dtype == "float64"
    late = [row for row in late_values(frame, "sessions") if row["collection"] != FORGOTTEN]
    [entry] = late
    fields = json.loads(entry["fields"])
    assert all(fields[name] == 1_767_228_518_477 for name in times)
    assert ".0" not in entry["fields"]


def test_a_forget_drops_the_halves_of_likes_naming_the_user_from_a_join_bucket() -> None:
    from examples.social.analytics.likes import HALF_COLUMNS, without_users

    def half(like_id: str, role: str, liker: int, author: int) -> tuple[Any, ...]:
        fields = {"like_id": like_id, "role": role, "liker_id": liker, "author_id": author}
        return (like_id, role, 1, 1_000, json.dumps(fields))

    halves = pd.DataFrame(
        [
            half("l1", "liker", 7, 3),  # liked by the user
            half("l1", "author", 7, 3),
            half("l2", "author", 4, 7),  # a post of the user's
            half("l3", "liker", 4, 3),
        ],
        columns=list(HALF_COLUMNS),
    )
    kept = without_users(halves, {7})
    assert list(zip(kept["like_id"], kept["role"], strict=True)) == [("l3", "liker")]
    assert without_users(halves, set()) is halves
