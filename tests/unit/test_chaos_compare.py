"""The chaos harness's counting (tests/chaos/compare.py): only what grew since the last check
is charged to the part killed since."""

from tests.chaos.compare import compare_profiles, compare_timelines, new_since, totals


def test_new_since_counts_only_the_growth_of_each_difference() -> None:
    before = {"timeline 7": (3, 0), "profile 2 followers": (0, 2), "search 9 missing": (1, 0)}
    now = {
        "timeline 7": (4, 0),  # one more post missing: 1, not 4
        "profile 2 followers": (0, 1),  # shrank: nothing new
        "search 9 missing": (1, 0),  # the same difference: nothing new
        "mirror 5 missing": (1, 0),  # new
    }
    assert new_since(before, now) == {"timeline 7": (1, 0), "mirror 5 missing": (1, 0)}
    assert totals(new_since(before, now)) == (2, 0)
    assert new_since({}, now) == now
    assert new_since(now, {}) == {}


def test_counters_and_timelines_split_into_lost_and_applied_twice() -> None:
    want = {1: {"user_id": 1, "handle": "a", "display_name": None, "bio": None}}
    counts = {"followers": 2, "following": 0, "posts": 3}
    got = {1: {**want[1], "followers": 3, "following": 0, "posts": 1}}
    assert compare_profiles({1: {**want[1], **counts}}, got) == {
        "profile 1 followers": (0, 1),
        "profile 1 posts": (2, 0),
    }
    assert compare_timelines({1: [5, 4]}, {1: [5, 5, 3]}) == {"timeline 1": (2, 1)}
