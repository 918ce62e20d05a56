"""What each analytics job must hold, computed from the generated workload alone: plain Python
over the events' *true* times (the generator's truth, not the jobs' correction), with the
lateness rule applied (a record the server received more than the allowed lateness after it
happened is beyond it). None of the jobs' code is used here."""

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from connectors.stores.kafka import partition_for
from tests.integration.analytics.feed import Workload

MINUTE = 60_000
HOUR = 60 * MINUTE
GAP = 30 * MINUTE


def floor(ms: int, unit: int) -> int:
    return ms - ms % unit


def activity_beyond(work: Workload) -> set[str]:
    """``kind:event_id`` of every activity event received more than the allowed lateness
    after it truly happened."""
    allowed = work.lateness.allowed_ms
    return {
        f"{e.type}:{e.event_id}"
        for e in work.activity
        if e.true_time is not None and e.received_time - e.true_time > allowed
    }


def posts_kept(work: Workload) -> list[Any]:
    return [p for p in work.posts if p.recorded - p.created <= work.lateness.allowed_ms]


def posts_beyond(work: Workload) -> set[str]:
    return {
        f"post:{p.event_id}"
        for p in work.posts
        if p.recorded - p.created > work.lateness.allowed_ms
    }


def activity_kept(work: Workload) -> list[Any]:
    beyond = activity_beyond(work)
    return [e for e in work.activity if f"{e.type}:{e.event_id}" not in beyond]


def windows(work: Workload, size: int) -> dict[tuple[int, str], tuple[int, int]]:
    """(window start, tag) -> (posts, posts received after the window ended); windows of
    ``size`` starting every minute."""
    out: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
    for post in posts_kept(work):
        last = floor(post.created, MINUTE)
        for start in range(last - size + MINUTE, last + 1, MINUTE):
            for tag in post.tags:
                entry = out[(start, tag)]
                entry[0] += 1
                entry[1] += int(post.recorded > start + size)
    return {k: (v[0], v[1]) for k, v in out.items()}


def sessions(work: Workload) -> dict[tuple[int, int], tuple[int, int, int, int]]:
    """(user, start) -> (last event, events, searches, clicks) with a 30-minute gap."""
    by_user: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for e in activity_kept(work):
        assert e.true_time is not None
        by_user[e.user_id].append((e.true_time, e.type))
    out = {}
    for user, events in by_user.items():
        events.sort()
        current: list[Any] | None = None
        for t, kind in events:
            if current is None or t - current[1] >= GAP:
                if current is not None:
                    out[(user, current[0])] = tuple(current[1:])
                current = [t, t, 0, 0, 0]
            current[1] = t
            current[2] += 1
            current[3 if kind == "search" else 4] += 1
        assert current is not None
        out[(user, current[0])] = tuple(current[1:])
    return out  # type: ignore[return-value]


@dataclass
class Ctr:
    clicks: dict[str, int]  # joined click id -> delay (ms)
    status: dict[str, str]  # search id -> open | clicked | no_click
    queries: dict[str, dict[str, int]]  # query -> searches, clicked, no_click, open


def ctr(work: Workload, partitions: int = 2) -> Ctr:
    allowed = work.lateness.allowed_ms
    kept = activity_kept(work)
    searches = {e.event_id: e for e in kept if e.type == "search"}
    clicks: dict[str, int] = {}
    clicked: set[str] = set()
    for e in kept:
        if e.type != "click" or e.search_id not in searches:
            continue
        search = searches[e.search_id]
        assert e.true_time is not None and search.true_time is not None
        delay = e.true_time - search.true_time
        if e.session_id == search.session_id and 0 <= delay <= HOUR:
            clicks[e.event_id] = delay
            clicked.add(search.event_id)
    clock: dict[int, int] = defaultdict(int)
    for e in work.activity:  # every record reaches the partition's clock, late ones too
        p = partition_for(e.session_id.encode(), partitions)
        clock[p] = max(clock[p], e.received_time)
    status = {}
    queries: dict[str, dict[str, int]] = defaultdict(
        lambda: {"searches": 0, "clicked": 0, "no_click": 0, "open": 0}
    )
    for sid, search in searches.items():
        assert search.true_time is not None
        p = partition_for(search.session_id.encode(), partitions)
        if sid in clicked:
            status[sid] = "clicked"
        elif search.true_time + HOUR + allowed < clock[p]:
            status[sid] = "no_click"
        else:
            status[sid] = "open"
        entry = queries[search.query or ""]
        entry["searches"] += 1
        entry[status[sid]] += 1
    return Ctr(clicks, status, dict(queries))


def likes(work: Workload) -> dict[str, tuple[str, str, str, str]]:
    """like id -> (liker handle, liker name, author handle, author name) as of the like."""
    versions = sorted(work.users, key=lambda v: (v.committed, v.lsn))

    def as_of(user: int, at: int) -> tuple[str, str]:
        found = ("", "")
        for v in versions:
            if v.user_id == user and v.committed <= at:
                found = (v.handle, v.name)
        return found

    return {
        like.like_id: (*as_of(like.liker, like.liked), *as_of(like.author, like.liked))
        for like in work.likes
    }


def alerts(work: Workload) -> dict[str, dict[str, Any]]:
    """alert id -> kind, user, and for bursts the start and post count."""
    out: dict[str, dict[str, Any]] = {}
    by_author: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for post in posts_kept(work):
        by_author[post.author].append((post.created, post.post_id))
    for author, posts in by_author.items():
        posts.sort()
        i = 0
        while i < len(posts):
            start = posts[i][0]
            inside = [p for p in posts[i:] if p[0] < start + MINUTE]
            if len(inside) >= 5:
                out[f"burst:{author}:{start}:{posts[i][1]}"] = {
                    "kind": "burst",
                    "user_id": author,
                    "posts": len(inside),
                }
                i += len(inside)
            else:
                i += 1
    following: dict[tuple[int, int], int] = {}
    for f in sorted(work.follows, key=lambda f: (f.at, f.follower)):
        pair = (f.follower, f.followee)
        if f.kind == "follow":
            following[pair] = f.at
        else:
            since = following.pop(pair)
            if f.at - since <= 10 * MINUTE:
                out[f"churn:{f.follower}:{f.followee}:{since}"] = {
                    "kind": "churn",
                    "user_id": f.follower,
                    "posts": None,
                }
    return out


def hourly(work: Workload) -> dict[tuple[str, str, int], dict[str, Any]]:
    """(metric, subject, hour) -> events, exact distinct users, the delays (sorted)."""
    users: dict[tuple[str, str, int], set[int]] = defaultdict(set)
    counts: dict[tuple[str, str, int], int] = defaultdict(int)
    delays: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    for post in posts_kept(work):
        for tag in post.tags:
            key = ("hashtag", tag, floor(post.created, HOUR))
            users[key].add(post.author)
            counts[key] += 1
    for e in activity_kept(work):
        if e.type != "click" or e.search_time is None:
            continue
        delay = e.event_time - e.search_time
        if 0 <= delay <= HOUR:
            assert e.true_time is not None
            key = ("click_delay", "", floor(e.true_time, HOUR))
            users[key].add(e.user_id)
            counts[key] += 1
            delays[key].append(delay)
    return {
        key: {"events": counts[key], "users": len(users[key]), "delays": sorted(delays[key])}
        for key in counts
    }
