"""Following assigned partitions as they grow, with a fetch wait that lengthens when it must.

On Tansu's object-store engines a fetch lists a partition's stored batches from the first one
and stops listing when the fetch's wait is up (the partitions of one fetch share that wait).
Once a partition holds more small batches than the wait lets the broker list (one command, one
result: one batch each), fetches come back empty below the high watermark, and a reader with a
short wait falls further behind as the partition grows (``connectors.kafka.fetching``). A
:class:`Follower` starts with a short wait; when a partition brings nothing for a while although
a fetch response reported records beyond its position, it opens its consumer again at its
positions with the next longer wait, and keeps it (a partition's batches only grow in number).
On Apache Kafka the first wait serves.
"""

import logging
import time
from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, Message, TopicPartition

from connectors.kafka.config import ClientValue, KafkaConfig
from connectors.kafka.fetching import longer_wait, stall_s

log = logging.getLogger(__name__)


class Follower:
    """An assigned, group-less consumer that tracks what it handed out and lengthens its fetch
    wait (opening a new consumer at those positions) while records are due but do not come."""

    def __init__(
        self,
        kafka: KafkaConfig,
        properties: Mapping[str, ClientValue],
        wait_ms: int,
        name: str = "reader",
    ) -> None:
        """``properties``: the consumer's settings besides ``fetch.wait.max.ms``, which starts
        at ``wait_ms``; ``name`` is used in the log line of a change of wait."""
        self.kafka = kafka
        self.properties = dict(properties)
        self.wait_ms = wait_ms
        self.name = name
        self._positions: dict[tuple[str, int], int] = {}
        self._due_since: dict[tuple[str, int], float] = {}  # records reported, none read since
        self._consumer = self._open()

    def _open(self) -> Consumer:
        return Consumer(
            self.kafka.client_properties(**{**self.properties, "fetch.wait.max.ms": self.wait_ms})
        )

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read these partitions from their offsets (a logical offset such as
        ``OFFSET_BEGINNING`` stays one until a record of the partition is read)."""
        chosen = list(partitions)
        self._positions = {(tp.topic, tp.partition): tp.offset for tp in chosen}
        self._due_since.clear()
        self._consumer.assign(chosen)

    def reassign(self, add: Iterable[TopicPartition], remove: Iterable[tuple[str, int]]) -> None:
        """Stop reading ``remove`` and start reading ``add`` (from their offsets); the other
        partitions go on from the next offset not yet handed out."""
        gone = set(remove)
        kept = [
            TopicPartition(t, p, offset)
            for (t, p), offset in sorted(self._positions.items())
            if (t, p) not in gone
        ]
        self.assign([*kept, *add])

    @property
    def consumer(self) -> Consumer:
        """The current consumer (a new one after each change of wait): for metadata."""
        return self._consumer

    @property
    def positions(self) -> dict[tuple[str, int], int]:
        """The next offset to hand out, per (topic, partition)."""
        return dict(self._positions)

    def poll(self, timeout: float) -> Message | None:
        """The next message (or error event), or None after ``timeout`` seconds."""
        msg = self._consumer.poll(timeout)
        self._seen([] if msg is None else [msg], drained=msg is None)
        return msg

    def consume(self, count: int, timeout: float) -> list[Message]:
        """Up to ``count`` messages, waiting at most ``timeout`` seconds for them."""
        messages = self._consumer.consume(count, timeout)
        self._seen(messages, drained=len(messages) < count)
        return messages

    def take(self, count: int, timeout: float) -> list[Message]:
        """Up to ``count`` messages as soon as one is there: waits at most ``timeout`` seconds
        for the first, then takes what is already fetched (:meth:`consume` waits the whole
        timeout whenever fewer than ``count`` messages come)."""
        first = self.poll(timeout)
        return [] if first is None else [first, *self.consume(count - 1, 0)]

    def close(self) -> None:
        self._consumer.close()

    def _seen(self, messages: list[Message], drained: bool) -> None:
        """Track positions; lengthen the wait when the fetched messages are all handed out
        (``drained``) and a partition has had records reported but none read for a while."""
        for msg in messages:
            offset = msg.offset()
            if msg.error() is None and offset is not None and offset >= 0:
                key = (msg.topic() or "", msg.partition() or 0)
                self._positions[key] = offset + 1
                self._due_since.pop(key, None)
        now = time.monotonic()
        stalled = False
        for key, position in self._positions.items():
            if self._due(key, position):
                stalled |= now - self._due_since.setdefault(key, now) > stall_s(self.wait_ms)
            else:
                self._due_since.pop(key, None)
        if stalled and drained:
            self._lengthen()

    def _due(self, key: tuple[str, int], position: int) -> bool:
        """Whether a fetch response reported records of the partition beyond ``position``."""
        try:
            low, high = self._consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
        except Exception:  # confluent_kafka.KafkaException: nothing known yet
            return False
        if high is None or high < 0:
            return False
        return bool(high > (position if position >= 0 else max(low or 0, 0)))

    def _lengthen(self) -> None:
        self._due_since.clear()
        longer = longer_wait(self.wait_ms)
        if longer == self.wait_ms:
            return
        self._consumer.close()
        self.wait_ms = longer
        self._consumer = self._open()
        self._consumer.assign(
            [TopicPartition(t, p, offset) for (t, p), offset in sorted(self._positions.items())]
        )
        log.info(
            "%s: fetches brought nothing below the partitions' end, fetch wait now %d ms",
            self.name,
            longer,
        )
