"""What a streaming planner remembers of true end offsets between triggers."""

from connectors.kafka.offsets import TrueEnds


def test_an_end_found_by_a_probe_holds_while_the_listed_end_stays() -> None:
    ends = TrueEnds()
    ref = ("t", 0)
    assert not ends.knows(ref, 5)
    assert ends.recall(ref, 5) == 5  # nothing known: the listed end
    ends.learn(ref, 5, 9)  # Tansu listed 5 (base of the last batch + 1), a fetch said 9
    assert ends.knows(ref, 5) and ends.recall(ref, 5) == 9
    # Records appended move the listed end: the old true end no longer holds.
    assert not ends.knows(ref, 10) and ends.recall(ref, 10) == 10
    assert not ends.knows(("t", 1), 5)


def test_a_probe_never_lowers_the_listed_end() -> None:
    ends = TrueEnds()
    ends.learn(("t", 0), 7, 3)
    assert ends.recall(("t", 0), 7) == 7


def test_a_remembered_end_is_probed_again_after_its_time() -> None:
    """Tansu's listed end can stay put while batches are appended: trusting a remembered true
    end for good left a planner below the true end until the next record came."""
    now = [100.0]
    ends = TrueEnds(ttl_s=2.0, clock=lambda: now[0])
    ends.learn(("t", 0), 5, 9)
    now[0] += 1.9
    assert ends.knows(("t", 0), 5)
    now[0] += 0.2
    assert not ends.knows(("t", 0), 5)  # probe again: the true end may have moved
    assert ends.recall(("t", 0), 5) == 9  # still a floor until the probe answers
