"""Every topic and view against the reference from the source of truth, as counted differences.

Each difference is keyed (e.g. ``profile 7 followers``) and counted as (lost, applied twice);
the definitions are in :mod:`tests.chaos`. Keys let the harness attribute to a part only the
differences that appeared since the previous check.
"""

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from examples.social.views.reference import (
    SocialState,
    expected_profiles,
    expected_search,
    expected_timelines,
    source_of_truth,
)
from infra.settings import Settings
from infra.verify import verify
from projections.view import View

Diffs = dict[str, tuple[int, int]]  # key -> (lost, applied twice)
COUNTERS = ("followers", "following", "posts")
PROFILE_FIELDS = ("user_id", "handle", "display_name", "bio")
SEARCH_FIELDS = ("text", "hashtags", "author_handle", "author_name")
USER_COLUMNS = ("handle", "display_name", "bio")


@dataclass(frozen=True)
class Answer:
    """What the workload got for one command (the result's JSON, or why none)."""

    command_id: str
    result: dict[str, Any] | None  # None: no result at all


def totals(diffs: Diffs) -> tuple[int, int]:
    return sum(v[0] for v in diffs.values()), sum(v[1] for v in diffs.values())


def new_since(before: Diffs, now: Diffs) -> Diffs:
    """What grew since ``before``: per key, the lost and applied-twice counts above the ones
    already there (a timeline that lacked 3 posts and now lacks 4 counts 1, not 4)."""
    out: Diffs = {}
    for key, (lost, twice) in now.items():
        was_lost, was_twice = before.get(key, (0, 0))
        grown = (max(lost - was_lost, 0), max(twice - was_twice, 0))
        if grown != (0, 0):
            out[key] = grown
    return out


# -- pure comparisons (expected vs actual) -------------------------------------------------


def compare_profiles(
    expected: Mapping[int, Mapping[str, Any]], actual: Mapping[int, Mapping[str, Any]]
) -> Diffs:
    out: Diffs = {}
    for user_id, want in expected.items():
        got = actual.get(user_id)
        if got is None:
            out[f"profile {user_id} missing"] = (1, 0)
            continue
        if any(_norm(got.get(f)) != _norm(want.get(f)) for f in PROFILE_FIELDS):
            out[f"profile {user_id} fields"] = (1, 0)
        for counter in COUNTERS:
            delta = int(got.get(counter) or 0) - int(want[counter])
            if delta:
                out[f"profile {user_id} {counter}"] = (max(-delta, 0), max(delta, 0))
    for user_id in actual.keys() - expected.keys():
        out[f"profile {user_id} not in users"] = (1, 0)
    return out


def compare_search(
    expected: Mapping[int, Mapping[str, Any]], actual: Mapping[int, Mapping[str, Any]]
) -> Diffs:
    out: Diffs = {}
    for post_id, want in expected.items():
        got = actual.get(post_id)
        if got is None:
            out[f"search {post_id} missing"] = (1, 0)
        elif any(_norm(got.get(f)) != _norm(want.get(f)) for f in SEARCH_FIELDS):
            out[f"search {post_id} differs"] = (1, 0)
    for post_id in actual.keys() - expected.keys():
        out[f"search {post_id} deleted post still indexed"] = (1, 0)
    return out


def compare_timelines(expected: Mapping[int, list[int]], actual: Mapping[int, list[int]]) -> Diffs:
    out: Diffs = {}
    for user_id in expected.keys() | actual.keys():
        want, got = expected.get(user_id, []), actual.get(user_id, [])
        twice = sum(n - 1 for n in Counter(got).values() if n > 1)
        lost = len(set(want) ^ set(got))
        if lost or twice:
            out[f"timeline {user_id}"] = (lost, twice)
    return out


def compare_rows(
    name: str, expected: Mapping[Any, tuple[Any, ...]], actual: Mapping[Any, tuple[Any, ...]]
) -> Diffs:
    out: Diffs = {}
    for key, row in expected.items():
        if key not in actual:
            out[f"{name} {key} missing"] = (1, 0)
        elif actual[key] != row:
            out[f"{name} {key} differs"] = (1, 0)
    for key in actual.keys() - expected.keys():
        out[f"{name} {key} not in source"] = (1, 0)
    return out


def compare_commands(
    answers: Iterable[Answer],
    stored_ids: set[str],
    events_per_command: Mapping[str, int],
    recorded: Mapping[str, dict[str, Any]],
    results_on_topic: Mapping[str, list[dict[str, Any]]],
) -> Diffs:
    """Commands sent against the event store: each answered, accepted ones stored exactly
    once.

    ``stored_ids``: every event id of the event store; ``events_per_command``: stored events
    per ``metadata.command_id``; ``recorded``: the commands table's result per command id;
    ``results_on_topic``: every record of ``command-results`` per command id.
    """
    out: Diffs = {}
    for answer in answers:
        result = answer.result
        if result is None:
            out[f"command {answer.command_id} unanswered"] = (1, 0)
        elif result.get("status") == "accepted":
            missing = [e for e in result.get("event_ids", []) if e not in stored_ids]
            if missing:
                out[f"command {answer.command_id} events missing"] = (len(missing), 0)
    for command_id, count in events_per_command.items():
        result = recorded.get(command_id) or {}
        expected = len(result.get("event_ids", [])) if result.get("status") == "accepted" else 0
        if count > expected:
            out[f"command {command_id} stored twice"] = (0, count - expected)
    for command_id, results in results_on_topic.items():
        accepted = {
            json.dumps(r.get("event_ids")) for r in results if r.get("status") == "accepted"
        }
        if len(accepted) > 1:
            out[f"command {command_id} two results"] = (0, len(accepted) - 1)
    return out


def _norm(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


# -- reading the source of truth and the views ----------------------------------------------


def read_views(views: Mapping[str, View], dsn: str, views_schema: str) -> dict[str, Any]:
    """What each view holds now."""
    profiles = {int(e.key): dict(e.fields) for e in views["profile"].store.scan("profiles")}
    search = {
        int(e.key): {k: e.fields.get(k) for k in SEARCH_FIELDS}
        for e in views["search"].store.scan("posts")
    }
    timelines: dict[int, list[int]] = {}
    mirror: dict[int, tuple[Any, ...]] = {}
    with psycopg.connect(dsn) as conn:
        for user_id, post_id in conn.execute(
            sql.SQL(
                "SELECT user_id, post_id FROM {} ORDER BY user_id, created_at DESC, post_id DESC"
            ).format(sql.Identifier(views_schema, "timeline"))
        ).fetchall():
            timelines.setdefault(int(user_id), []).append(int(post_id))
        for row in conn.execute(
            sql.SQL("SELECT id, handle, display_name, bio FROM {}").format(
                sql.Identifier(views_schema, "public_users")
            )
        ).fetchall():
            mirror[int(row[0])] = tuple(row[1:])
    return {"profiles": profiles, "search": search, "timelines": timelines, "mirror": mirror}


def read_users(dsn: str) -> dict[int, tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, handle, display_name, bio FROM public.users").fetchall()
    return {int(r[0]): tuple(r[1:]) for r in rows}


def read_commands(
    dsn: str, schema: str
) -> tuple[set[str], dict[str, int], dict[str, dict[str, Any]]]:
    """Every event id, stored events per command id, and the recorded result per command."""
    with psycopg.connect(dsn) as conn:
        ids = {
            str(r[0])
            for r in conn.execute(
                sql.SQL("SELECT event_id FROM {}").format(sql.Identifier(schema, "events"))
            ).fetchall()
        }
        per_command = {
            str(r[0]): int(r[1])
            for r in conn.execute(
                sql.SQL(
                    "SELECT metadata->>'command_id', count(*) FROM {}"
                    " WHERE metadata ? 'command_id' GROUP BY 1"
                ).format(sql.Identifier(schema, "events"))
            ).fetchall()
        }
        recorded = {
            str(r[0]): dict(r[1])
            for r in conn.execute(
                sql.SQL("SELECT command_id, result FROM {}").format(
                    sql.Identifier(schema, "commands")
                )
            ).fetchall()
        }
    return ids, per_command, recorded


def compare_all(
    s: Settings,
    views: Mapping[str, View],
    answers: Iterable[Answer],
    results_on_topic: Mapping[str, list[dict[str, Any]]],
) -> Diffs:
    """Every topic and view against the source of truth (topics through ``verify``)."""
    dsn = s.postgres().dsn
    out: Diffs = {}
    report = verify(s, views=False)
    for error in report.errors:
        out[f"verify error {error[:80]}"] = (1, 0)
    for table in report.tables:
        for key in table.missing:
            out[f"topic {table.topic} {key} missing"] = (1, 0)
        for key in table.stale:
            out[f"topic {table.topic} {key} stale"] = (1, 0)
        for key in table.extra:
            out[f"topic {table.topic} {key} deleted row on topic"] = (1, 0)
    if report.events is not None:
        for kind, stream, version in report.events.missing:
            out[f"topic events.{kind} {stream}@{version} missing"] = (1, 0)
        for event_id in report.events.unknown:
            out[f"topic events.* {event_id} not in the event store"] = (0, 1)
    state: SocialState = source_of_truth(dsn, s.event_store_schema)
    held = read_views(views, dsn, s.views_schema)
    out.update(compare_profiles(expected_profiles(state), held["profiles"]))
    out.update(compare_search(expected_search(state), held["search"]))
    out.update(compare_timelines(expected_timelines(state), held["timelines"]))
    out.update(compare_rows("mirror", read_users(dsn), held["mirror"]))
    ids, per_command, recorded = read_commands(dsn, s.event_store_schema)
    out.update(compare_commands(answers, ids, per_command, recorded, results_on_topic))
    return out
