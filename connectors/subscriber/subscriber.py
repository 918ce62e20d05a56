"""The subscriber: a consumer-group (or assigned) reader that yields typed records.

At-least-once by default: a record counts as processed once the caller asks for the next one
(iteration, :meth:`Subscriber.poll`) or calls :meth:`Subscriber.commit`; only processed offsets
are ever committed (``enable.auto.commit`` is off). In ``commit="auto"`` mode they are committed
synchronously at most ``commit_interval`` seconds after processing, when the subscriber is idle,
when partitions are revoked by a rebalance and on :meth:`Subscriber.close`; in ``"manual"`` mode
only by :meth:`Subscriber.commit`. A crash re-delivers what was processed after the last commit,
never skips anything.
"""

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Generic, Literal, TypeAlias, TypeVar

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaException, TopicPartition

from connectors.kafka.admin import TopicAdmin
from connectors.kafka.config import ClientValue, KafkaConfig
from connectors.schema_registry.errors import RegistryUnavailableError
from connectors.subscriber.errors import SubscriberError
from connectors.subscriber.policies import DeadLetters, ErrorPolicy, Undecodable
from connectors.subscriber.records import (
    Delivery,
    EventDecoder,
    EventRecord,
    Headers,
    KafkaPosition,
    Reveal,
)
from tributary.changes import ChangeEvent

log = logging.getLogger(__name__)

E = TypeVar("E")

#: Where to start: the oldest or the newest record (for partitions the group has no commit
#: for), or stored positions — each the *next* record to read (``delivery.position.next()``,
#: or what :meth:`Subscriber.positions` returned).
Start: TypeAlias = Literal["earliest", "latest"] | Iterable[KafkaPosition]
CommitMode = Literal["auto", "manual"]
Partition = tuple[str, int]

CDC_PREFIX = "cdc."
EVENT_PREFIX = "events."


class Subscriber(Generic[E]):
    """Reads ``cdc.*`` and ``events.*`` topics as typed :class:`Delivery` records.

    Iterate it (``for delivery in subscriber``: blocks for new records) or call :meth:`poll`.
    Not thread-safe: use one subscriber per thread or process; several in one group share
    the partitions.
    """

    def __init__(
        self,
        topics: Sequence[str],
        group_id: str | None,
        *,
        kafka: KafkaConfig,
        event_decoder: Callable[[EventRecord], E],
        start: Start = "earliest",
        assign: bool = False,
        on_error: ErrorPolicy | None = None,
        dead_letter_topic: str | None = None,
        commit: CommitMode = "auto",
        commit_interval: float = 1.0,
        cdc_prefix: str = CDC_PREFIX,
        event_prefix: str = EVENT_PREFIX,
        properties: Mapping[str, ClientValue] | None = None,
        schema_registry_url: str | None = None,
        reveal: Reveal | None = None,
    ) -> None:
        if not topics:
            raise SubscriberError("subscribe to at least one topic")
        if group_id is None and not assign:
            raise SubscriberError("a consumer group needs a group_id (or use assign=True)")
        self.topics = list(topics)
        self.group_id = group_id
        self.kafka = kafka
        self.commit_mode: CommitMode = commit
        self.commit_interval = commit_interval
        self.cdc_prefix = cdc_prefix
        self.event_prefix = event_prefix
        self._convert = event_decoder
        self._events = EventDecoder(schema_registry_url, reveal)
        self._on_error = on_error or DeadLetters(kafka, dead_letter_topic)
        self._stored: dict[Partition, int] = {}
        if isinstance(start, str):
            if start not in ("earliest", "latest"):
                raise SubscriberError(f"start must be 'earliest', 'latest' or positions: {start!r}")
            reset = start
        else:
            self._stored = {(p.topic, p.partition): p.offset for p in start}
            reset = "earliest"
        self._start = start
        self._processed: dict[Partition, int] = {}  # next offset to commit, per partition
        self._in_hand: KafkaPosition | None = None
        self._uncommitted = False  # processed offsets not committed yet
        self._assigned: set[Partition] = set()
        self._last_commit = time.monotonic()
        self._closed = False
        props: dict[str, ClientValue] = {
            "group.id": group_id or f"{kafka.client_id}-replay",
            "enable.auto.commit": False,
            "auto.offset.reset": reset,
            "fetch.wait.max.ms": 50,
        }
        props.update(properties or {})
        try:
            self._consumer = Consumer(kafka.client_properties(**props))
        except KafkaException as exc:
            raise SubscriberError(f"cannot create a Kafka consumer: {exc}") from exc
        if assign:
            self._assign_explicitly()
        else:
            self._consumer.subscribe(
                self.topics,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )

    # -- reading -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Delivery[E]]:
        while not self._closed:
            delivery = self.poll(1.0)
            if delivery is not None:
                yield delivery

    def poll(self, timeout: float = 1.0) -> Delivery[E] | None:
        """The next record, or None after ``timeout`` seconds without one. The record handed
        out before counts as processed."""
        self._done()
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            msg = self._consumer.poll(left)
            if msg is None:
                if self.commit_mode == "auto" and self._uncommitted:
                    self._commit()  # idle: leave nothing processed uncommitted
                return None
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise SubscriberError(f"the consumer failed: {err.str()}", err.name())
                log.warning("consumer: %s", err.str())
                continue
            delivery = self._deliver(msg)
            if delivery is not None:
                self._in_hand = delivery.position
                return delivery
            self._done()  # the error policy took it
            if time.monotonic() >= deadline:
                return None

    def _deliver(self, msg: Any) -> Delivery[E] | None:
        position = KafkaPosition(msg.topic(), msg.partition(), msg.offset())
        key: bytes | None = msg.key()
        value: bytes | None = msg.value()
        headers = _headers(msg.headers())
        try:
            decoded = self._decode(position.topic, key, value, headers)
        except RegistryUnavailableError:
            raise  # the registry does not answer: not the record's fault
        except Exception as exc:  # any decoder failure is the record's fault, not ours
            failed = Undecodable(position, key, value, headers, _reason(exc), exc, self.group_id)
            try:
                self._on_error(failed)
            except BaseException:
                # Not processed: read it again if the caller polls on.
                self._consumer.seek(
                    TopicPartition(position.topic, position.partition, msg.offset())
                )
                raise
            self._in_hand = position
            return None
        _, ts = msg.timestamp()
        return Delivery(decoded, position, key, headers, ts if ts and ts > 0 else None)

    def _decode(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers
    ) -> ChangeEvent | E:
        if topic.startswith(self.cdc_prefix):
            return ChangeEvent.from_kafka(topic, key, value, headers)
        if topic.startswith(self.event_prefix):
            return self._convert(self._events.decode(topic, value))
        raise SubscriberError(
            f"{topic} is neither a change topic ({self.cdc_prefix}*) nor an event topic"
            f" ({self.event_prefix}*)"
        )

    # -- positions and commits ------------------------------------------------------------

    def _done(self) -> None:
        """The record in hand is processed: its next offset may be committed."""
        if self._in_hand is not None:
            p = self._in_hand
            self._processed[(p.topic, p.partition)] = p.offset + 1
            self._in_hand = None
            self._uncommitted = True
        if (
            self.commit_mode == "auto"
            and self._uncommitted
            and time.monotonic() - self._last_commit >= self.commit_interval
        ):
            self._commit()

    def positions(self) -> list[KafkaPosition]:
        """Per partition read so far, the next record to read (store it, pass it as ``start``).
        Includes the record in hand only after :meth:`commit` or the next :meth:`poll`."""
        return sorted(KafkaPosition(t, p, o) for (t, p), o in self._processed.items())

    def commit(self) -> list[KafkaPosition]:
        """Mark every record handed out so far processed and commit synchronously; returns
        the committed positions (the next record to read per partition)."""
        self._done()
        committed = self.positions()
        self._commit(strict=True)
        return committed

    def _commit(self, only: set[Partition] | None = None, strict: bool = False) -> None:
        """Commit the processed offsets (of ``only`` those partitions). A failed automatic
        commit is logged and retried later (``strict``: raised, for :meth:`commit`)."""
        self._last_commit = time.monotonic()
        offsets = [
            TopicPartition(t, p, o)
            for (t, p), o in self._processed.items()
            if only is None or (t, p) in only
        ]
        if offsets and self.group_id is not None:
            try:
                self._consumer.commit(offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                error = SubscriberError(
                    f"cannot commit {len(offsets)} offset(s) for group {self.group_id}: {exc}"
                    " (the records after the last commit will be delivered again)"
                )
                if strict:
                    raise error from exc
                log.warning("%s", error)
                return
        if only is None:
            self._uncommitted = False

    # -- partitions ------------------------------------------------------------------------

    def assignment(self) -> list[Partition]:
        """The partitions this subscriber reads now."""
        return sorted(self._assigned)

    def _assign_explicitly(self) -> None:
        if not isinstance(self._start, str):
            parts = [TopicPartition(t, p, o) for (t, p), o in self._stored.items()]
        else:
            at = OFFSET_BEGINNING if self._start == "earliest" else OFFSET_END
            admin = TopicAdmin(self.kafka)
            parts = []
            for topic in self.topics:
                count = admin.partition_count(topic)
                if count is None:
                    raise SubscriberError(f"topic {topic} does not exist (assign mode needs it)")
                parts += [TopicPartition(topic, p, at) for p in range(count)]
        self._consumer.assign(parts)
        self._assigned = {(tp.topic, tp.partition) for tp in parts}

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            stored = self._stored.pop((tp.topic, tp.partition), None)
            if stored is not None:  # a stored position wins, once, over the group's commit
                tp.offset = stored
        consumer.assign(partitions)
        self._assigned |= {(tp.topic, tp.partition) for tp in partitions}

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = {(tp.topic, tp.partition) for tp in partitions}
        if self.commit_mode == "auto":  # a failure is logged: the next owner re-reads
            self._commit(revoked)
        self._forget(revoked)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._forget({(tp.topic, tp.partition) for tp in partitions})

    def _forget(self, partitions: set[Partition]) -> None:
        for part in partitions:
            self._processed.pop(part, None)
        self._assigned -= partitions

    # -- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Commit what was processed (``auto`` mode; the record in hand is not) and leave."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.commit_mode == "auto":
                self._commit()
        finally:
            self._consumer.close()

    def __enter__(self) -> "Subscriber[E]":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _headers(
    raw: dict[str, str | bytes | None] | list[tuple[str, str | bytes | None]] | None,
) -> Headers:
    items = list(raw.items()) if isinstance(raw, dict) else (raw or [])
    return {k: (v.encode() if isinstance(v, str) else v) for k, v in items}


def _reason(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"
