"""``cdc.*`` records come through as ChangeEvents, tombstones included; a subscriber resumes
from a stored position."""

from connectors.subscriber import KafkaPosition
from tests.integration.conftest import Endpoints
from tests.integration.subscribe.conftest import read_until, subscribed
from tests.integration.subscribe.feed import change, produce, tombstone
from tributary.changes import ChangeEvent


def test_changes_and_tombstones_come_through_as_change_events(
    stack: Endpoints, unique: str
) -> None:
    topic = f"cdc.public.users_{unique}"
    produce(
        stack.kafka,
        [
            change(topic, 1, "c", 100, None, {"id": 1, "name": "ada"}),
            change(topic, 2, "r", 105, None, {"id": 2, "name": "bob"}),
            change(topic, 1, "u", 110, {"id": 1, "name": "ada"}, {"id": 1, "name": "ada l."}),
            change(topic, 1, "d", 120, {"id": 1, "name": "ada l."}, None),
            tombstone(topic, 1, 120),
        ],
        partitions=1,
    )
    with subscribed(stack, [topic], f"changes-{unique}") as subscriber:
        got = read_until(subscriber, lambda out: len(out) >= 5)
    changes = [d.value for d in got]
    assert all(isinstance(c, ChangeEvent) for c in changes)
    ones = [c for c in changes if isinstance(c, ChangeEvent) and c.key == {"id": 1}]
    assert [c.op for c in ones] == ["c", "u", "d", None]
    assert [c.position for c in ones] == [100, 110, 120, 120]
    assert ones[1].row == {"id": 1, "name": "ada l."}
    delete, dead = ones[2], ones[3]
    assert delete.is_delete and not delete.is_tombstone and delete.row is None
    assert dead.is_tombstone and dead.is_delete and dead.after is None
    assert got[-1].position == KafkaPosition(topic, 0, 4) and got[-1].key == b'{"id": 1}'

    # A stored position (the next record to read) wins over the group's commits.
    with subscribed(stack, [topic], f"changes-{unique}", start=[got[2].position.next()]) as again:
        rest = read_until(again, lambda out: len(out) >= 2)
        assert again.poll(1.0) is None
    assert [d.position.offset for d in rest] == [3, 4]

    # Assign mode from stored positions: exactly those partitions, from there.
    with subscribed(stack, [topic], None, start=[got[3].position]) as s:
        assert [d.position.offset for d in read_until(s, lambda out: len(out) >= 2)] == [3, 4]
