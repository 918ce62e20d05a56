"""Two subscribers in one group share the partitions; one is killed (SIGKILL) and a new one
started.

What is asserted, precisely (B = the member in a child process, A = the survivor, C = the new
member; ``committed[p]`` = the group's committed offset of partition p read after the kill):

- while A and B both run they own disjoint partitions and no record is seen by both;
- on each partition B read, ``committed[p] <= (B's last offset on p) + 1``: only records B was
  handed *and then asked past* are committed;
- after the kill, the first record of p that A or C sees is at offset ``committed[p]`` exactly:
  nothing committed is seen again, nothing is skipped;
- every record is seen at least once by A, B or C, and the records seen twice are exactly those
  of B's partitions from ``committed[p]`` to B's last offset (handled, not yet committed);
- each member sees each key's events in version order.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from connectors.kafka import TopicAdmin, history_topic
from connectors.subscriber import Delivery, EventRecord, Subscriber
from tests.integration.conftest import Endpoints
from tests.integration.kafka_reading import read_topic
from tests.integration.subscribe.conftest import subscribed
from tests.integration.subscribe.feed import post_events, produce

PARTITIONS = 4
POSTS, PER_POST = 200, 10  # 2,000 events
ROOT = Path(__file__).resolve().parents[3]

Seen = tuple[int, int]  # (partition, offset)


class Member:
    """The child-process member and what it printed."""

    def __init__(self, bootstrap: str, topic: str, group: str, registry: str) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.subscribe.member",
                bootstrap,
                topic,
                group,
                "0.01",
                registry,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.assignment: set[int] = set()
        self.records: list[tuple[int, int, str, int]] = []
        self.drained = False  # the reader has read its output to the end (EOF)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.endswith("\n"):  # the unfinished last line of a killed member
                break  # (only EOF follows it)
            kind, *rest = line.split()
            if kind == "A":
                self.assignment = {int(item.rsplit(":", 1)[1]) for item in rest}
            elif kind == "R":
                self.records.append((int(rest[0]), int(rest[1]), rest[2], int(rest[3])))
        self.drained = True

    def kill(self) -> None:
        """SIGKILL, then wait (bounded) for the reader to read its pipe to EOF: ``drained``
        says it did, and then ``records`` holds every line the member wrote."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(10)


def _poll(sub: Subscriber[EventRecord], into: list[Delivery[EventRecord]]) -> None:
    """Take what the subscriber has now (each poll hands one record; waiting 50 ms per record
    while the other member is idle made the test crawl)."""
    delivery = sub.poll(0.05)
    while delivery is not None:
        into.append(delivery)
        delivery = sub.poll(0)


def _wait(check: Callable[[], bool], timeout: float, what: str, step: Callable[[], None]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        step()


def test_members_share_partitions_and_a_killed_one_loses_and_repeats_nothing_committed(
    stack: Endpoints, unique: str
) -> None:
    aggregate = f"post_{unique}"
    topic, group = f"events.{aggregate}", f"group-{unique}"
    TopicAdmin(stack.kafka).ensure(history_topic(topic, PARTITIONS))
    records = post_events(aggregate, POSTS, PER_POST, stack.settings.registry_url)
    produce(stack.kafka, records[:0], partitions=PARTITIONS)  # the topic only

    b = Member(stack.bootstrap_servers, topic, group, stack.settings.registry_url)
    a_seen: list[Delivery[EventRecord]] = []
    c_seen: list[Delivery[EventRecord]] = []
    a = subscribed(stack, [topic], group, commit_interval=0.2)
    c: Subscriber[EventRecord] | None = None
    try:

        def shared() -> bool:
            mine = {p for _, p in a.assignment()}
            return (
                bool(mine)
                and bool(b.assignment)
                and mine | b.assignment == set(range(PARTITIONS))
                and not mine & b.assignment
            )

        _wait(shared, 60, "both members to own partitions", lambda: _poll(a, a_seen))
        produce(stack.kafka, records, partitions=PARTITIONS)
        _wait(
            lambda: len(b.records) >= 150, 60, "B to handle 150 records", lambda: _poll(a, a_seen)
        )

        # Both alive: disjoint partitions, no record seen twice.
        b_parts = set(b.assignment)
        a_before = {(d.position.partition, d.position.offset) for d in a_seen}
        b_before = {(p, o) for p, o, _, _ in b.records}
        assert not a_before & b_before
        assert {p for p, _ in a_before}.isdisjoint({p for p, _ in b_before})

        b.kill()
        # Every line B wrote is read (its pipe at EOF), with no sleep to guess when.
        assert b.drained, "the killed member's output was not read to EOF within 10 s"
        b_last = {
            p: max(o for q, o, _, _ in b.records if q == p)
            for p in b_parts
            if any(q == p for q, _, _, _ in b.records)
        }
        committed = _committed(stack, topic, group)
        for p in b_parts:
            assert committed[p] <= b_last.get(p, -1) + 1, (p, committed[p], b_last.get(p))

        c = subscribed(stack, [topic], group, commit_interval=0.2)
        expected = {(r.partition, r.offset) for r in read_topic(stack.kafka, topic)}

        def everything() -> bool:
            seen = {(d.position.partition, d.position.offset) for d in a_seen + c_seen}
            return expected <= seen | {(p, o) for p, o, _, _ in b.records}

        def step() -> None:
            _poll(a, a_seen)
            assert c is not None
            _poll(c, c_seen)

        _wait(everything, 90, "A and C to read everything", step)
        for _ in range(20):  # anything left would show up now
            step()
    finally:
        if b.proc.poll() is None:
            b.kill()
        a.close()
        if c is not None:
            c.close()

    # After the kill, B's partitions resume exactly at their committed offsets.
    after_kill = [d for d in a_seen + c_seen if d.position.partition in b_parts]
    for p in b_parts:
        first = min(d.position.offset for d in after_kill if d.position.partition == p)
        assert first == committed[p], (p, first, committed[p])

    counts = Counter(
        [(d.position.partition, d.position.offset) for d in a_seen + c_seen]
        + [(p, o) for p, o, _, _ in b.records]
    )
    assert set(counts) == expected  # nothing skipped
    twice = {pos for pos, n in counts.items() if n > 1}
    assert all(n <= 2 for n in counts.values())
    assert twice == {(p, o) for p, o, _, _ in b.records if o >= committed[p]}, (
        "only what B handled after its last commit is seen again"
    )

    orders: list[list[tuple[str, int]]] = [
        [(d.value.stream_id, d.value.version) for d in a_seen],
        [(d.value.stream_id, d.value.version) for d in c_seen],
        [(s, v) for _, _, s, v in b.records],
    ]
    for order in orders:
        per_key: dict[str, list[int]] = defaultdict(list)
        for stream, version in order:
            per_key[stream].append(version)
        assert all(vs == sorted(vs) for vs in per_key.values())
    print(
        f"A saw {len(a_seen)}, B {len(b.records)} (killed), C {len(c_seen)};"
        f" {len(twice)} seen twice; committed at the kill: {committed}"
    )


def _committed(stack: Endpoints, topic: str, group: str) -> dict[int, int]:
    consumer = Consumer(stack.kafka.client_properties(**{"group.id": group}))
    try:
        parts = consumer.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10
        )
    finally:
        consumer.close()
    # No commit yet (OFFSET_INVALID): the group starts that partition at its first record.
    return {tp.partition: max(tp.offset, 0) for tp in parts}
