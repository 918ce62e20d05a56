"""The Kafka entry point: a processor for the ``commands`` topic and a client that sends to it.

Wire format. ``commands``: key = the aggregate's stream id (so one stream's commands stay
in order on one partition), value = JSON ``{"command_id": str, "type": str, "data": {…}}``.
``command-results``: key = the command id, value = the result's JSON
(``{"status": "accepted", …}`` or ``{"status": "rejected", "reason": …}``).

Position strategy. The processor reads *assigned* partitions (no consumer group: a group
join costs ~23 s on the local broker, and one processor owns its partitions). For each
batch it handles every message through the :class:`CommandBus`, produces each result,
flushes the producer, and only then stores the next offsets in PostgreSQL
(``consumer_positions``), with the results topic's offsets after the batch's results in the
same transaction. A crash anywhere re-reads at most the last batch, which is harmless: the
bus records every handled command id with its result in the same transaction as its events,
so a re-read command appends nothing and gets its first result; a restarted processor first
reads what the results topic gained after the stored offsets, and a command whose result is
there already is not answered twice. Storing the offset in the command's own transaction
instead would lose the result of a command committed just before a crash. Messages without a
usable command id cannot be recorded; they are rejected again, identically, and nothing is
stored for them.

Fetch wait. The consumer's fetch wait starts short and lengthens when fetches stop bringing
records below a partition's end (Tansu lists a partition's batches only as long as the wait
lets it, and the commands topic holds one batch per command): :mod:`connectors.kafka.following`.

No poison loops. Whatever one command's content causes — a malformed envelope, data that
does not decode, a handler that raises (``ZeroDivisionError``), data PostgreSQL refuses
(SQLSTATE classes 22, 23, 54: a NUL character in ``jsonb``) — is answered as that command's
rejection, naming the cause, and the processor moves on to the next message
(:mod:`event_store.faults`). Only a failure of the infrastructure (PostgreSQL or the broker
cannot be reached, a lost connection, a missing schema) stops :meth:`CommandProcessor.run`:
the message was not handled, and a restarted processor reads it again.
"""

import json
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition

from connectors.errors import KafkaError, TopicRewoundError
from connectors.kafka import KafkaConfig, TopicAdmin, TopicSpec
from connectors.kafka.config import ClientValue
from connectors.kafka.fetching import SHORT_WAIT_MS
from connectors.kafka.following import Follower
from connectors.kafka.offsets import probe_consumer, true_watermarks
from connectors.kafka.producing import IDEMPOTENT, Deliveries, idempotent_producer
from connectors.kafka.reading import read_tail
from event_store.bus import CommandBus
from event_store.command import CommandResult, Rejected, result_from_json
from event_store.consumer_positions import ConsumerPositions
from event_store.errors import (
    CommandTimeoutError,
    ConcurrencyError,
    EventStoreError,
    MalformedCommandError,
    StorageError,
)
from event_store.faults import brief, command_fault, traceback_of
from event_store.prepared import StatementsLost
from event_store.registry import CommandRegistry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommandTopics:
    """Names and partition count of the command and result topics."""

    commands: str = "commands"
    results: str = "command-results"
    partitions: int = 4

    def specs(self) -> list[TopicSpec]:
        return [
            TopicSpec(self.commands, self.partitions, "delete"),
            TopicSpec(self.results, self.partitions, "delete"),
        ]


def ensure_topics(kafka: KafkaConfig, topics: CommandTopics) -> None:
    """Create the command and result topics if absent (checking them otherwise)."""
    admin = TopicAdmin(kafka)
    for spec in topics.specs():
        admin.ensure(spec)


@dataclass(frozen=True)
class CommandEnvelope:
    """A decoded ``commands`` message: its id, its type name and its data (not yet checked)."""

    command_id: str
    type: str
    data: dict[str, Any]

    def to_json(self) -> bytes:
        return json.dumps(
            {"command_id": self.command_id, "type": self.type, "data": self.data}
        ).encode()


#: The longest command id an envelope may carry: up to 2 kB in UTF-8, which the primary
#: key's index of the commands table always holds (a btree row holds about 2.7 kB).
MAX_COMMAND_ID_CHARS = 512


def parse_envelope(value: bytes | None) -> CommandEnvelope:
    """Decode a message value; raises :class:`MalformedCommandError` saying what is wrong."""
    if value is None:
        raise MalformedCommandError("message has no value (expected a JSON command envelope)")
    try:
        parsed = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedCommandError(f"message value is not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise MalformedCommandError("message value must be a JSON object")
    command_id = parsed.get("command_id")
    if not isinstance(command_id, str) or not command_id.strip():
        raise MalformedCommandError("command_id is missing or not a non-empty string")
    if len(command_id) > MAX_COMMAND_ID_CHARS:
        raise MalformedCommandError(
            f"command_id is longer than {MAX_COMMAND_ID_CHARS} characters ({len(command_id)}):"
            " the store cannot index it; send a shorter idempotency key (a UUID)",
            command_id,
        )
    command_type = parsed.get("type")
    if not isinstance(command_type, str) or not command_type:
        raise MalformedCommandError("type is missing or not a non-empty string", command_id)
    data = parsed.get("data", {})
    if not isinstance(data, dict):
        raise MalformedCommandError("data must be a JSON object", command_id)
    extra = sorted(set(parsed) - {"command_id", "type", "data"})
    if extra:
        raise MalformedCommandError(f"unknown envelope fields: {', '.join(extra)}", command_id)
    return CommandEnvelope(command_id, command_type, data)


def handle_message(bus: CommandBus, value: bytes | None) -> CommandResult:
    """The result of one ``commands`` message; never raises for a bad message.

    Errors of the infrastructure (PostgreSQL unreachable, ...) do propagate: the message
    was not handled, and the processor must not move past it. Everything the message's
    content causes is its rejection (:func:`~event_store.faults.command_fault`).
    """
    try:
        envelope = parse_envelope(value)
    except MalformedCommandError as exc:
        return Rejected(exc.command_id, exc.reason)
    try:
        command = bus.registry.decode(envelope.type, envelope.data)
        return bus.send(command, envelope.command_id)
    except ConcurrencyError as exc:
        return Rejected(envelope.command_id, f"gave up after retries: {exc}")
    except (StorageError, StatementsLost):
        raise  # the database failed, not the command: do not move past the message
    except EventStoreError as exc:  # a stored event that does not decode, ...
        return Rejected(envelope.command_id, str(exc))
    except Exception as exc:
        reason = command_fault(exc)
        if reason is None:
            raise
        log.warning(
            "command %s rejected: %s%s", brief(envelope.command_id), reason, traceback_of(exc)
        )
        return Rejected(envelope.command_id, reason)


# The command processor's clients: positions are stored with the results in PostgreSQL, never
# committed to Kafka. The fetch wait starts short (Tansu holds an empty fetch for its whole
# wait) and lengthens when fetches stop bringing records below the end (on Tansu, a partition
# of one batch per command outgrows what a short wait lists): see connectors.kafka.following.
PROCESSOR_CONSUMER: dict[str, ClientValue] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
}
PROCESSOR_FETCH_WAIT_MS = 50
# A result waiter's consumer: group-less, assigned, never commits; its wait starts short.
WAITER_CONSUMER: dict[str, ClientValue] = {
    "group.id": "tributary-result-waiter",
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
}
PROCESSOR_PRODUCER: dict[str, ClientValue] = {**IDEMPOTENT, "linger.ms": 5}
PROCESSOR_BATCH = 500  # most commands handled per batch


class CommandProcessor:
    """Consumes ``commands``, handles each through the bus, produces to ``command-results``."""

    def __init__(
        self,
        bus: CommandBus,
        kafka: KafkaConfig,
        topics: CommandTopics | None = None,
        consumer_name: str = "command-processor",
        partitions: Sequence[int] | None = None,
        batch_size: int = PROCESSOR_BATCH,
    ) -> None:
        self.bus = bus
        self.kafka = kafka
        self.topics = topics or CommandTopics()
        self.positions = ConsumerPositions(bus.store.tables, consumer_name)
        self.batch_size = batch_size
        self.handled = 0
        self._stop = threading.Event()
        self._consumer = Follower(
            kafka,
            {"group.id": consumer_name, **PROCESSOR_CONSUMER},
            PROCESSOR_FETCH_WAIT_MS,
            f"command processor {consumer_name}",
        )
        self._producer = Producer(kafka.client_properties(**PROCESSOR_PRODUCER))
        self._partitions = list(partitions) if partitions is not None else None
        self._assigned = False
        self._published: set[bytes] = set()  # results on the topic the saved batches lack

    def stop(self) -> None:
        """Ask :meth:`run` to return after the current batch (thread-safe)."""
        self._stop.set()

    def run(self, poll_timeout: float = 0.5) -> None:
        """Process batches until :meth:`stop` is called."""
        try:
            while not self._stop.is_set():
                self.process_batch(poll_timeout)
        finally:
            self.close()

    def process_batch(self, timeout: float = 0.5) -> int:
        """Handle the next batch (up to ``batch_size`` messages); returns how many."""
        self._assign()
        # Wait for the first message only; then take what is already fetched. (consume(n, t)
        # would wait the whole timeout whenever fewer than n messages are there.)
        first = self._consumer.poll(timeout)
        if first is None:
            return 0
        messages = [first, *self._consumer.consume(self.batch_size - 1, 0)]
        next_offsets: dict[int, int] = {}
        handled = 0
        deliveries = Deliveries()
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise KafkaError(f"consuming {self.topics.commands}: {err.str()}", err.name())
                log.warning("consume error on %s: %s", self.topics.commands, err.str())
                continue
            result = handle_message(self.bus, msg.value())
            # a command id read from JSON may hold a lone surrogate: keep it, byte for byte
            key = (
                None
                if result.command_id is None
                else result.command_id.encode("utf-8", "surrogatepass")
            )
            if key is not None and key in self._published:
                self._published.discard(key)  # published before a crash: not twice
            else:
                self._producer.produce(
                    self.topics.results,
                    key=key,
                    value=json.dumps(result.to_json()).encode(),
                    on_delivery=deliveries,
                )
                self._producer.poll(0)
            partition, offset = msg.partition(), msg.offset()
            if partition is not None and offset is not None:
                next_offsets[partition] = offset + 1
            handled += 1
        if not next_offsets:
            return 0
        failure = deliveries.confirm(self._producer, 30)
        if failure is not None:  # not acknowledged: stop before saving positions, re-read
            raise KafkaError(f"results not delivered to {self.topics.results}: {failure}")
        published = {p: end for (t, p), end in deliveries.ends.items() if t == self.topics.results}
        with self.bus.store.engine.begin() as conn:
            self.positions.save(conn, self.topics.commands, next_offsets)
            self.positions.save(conn, self.topics.results, published)
        self.handled += handled
        return handled

    def close(self) -> None:
        self._producer.flush(30)
        self._consumer.close()

    def _assign(self) -> None:
        if self._assigned:
            return
        topic = self.topics.commands
        metadata = self._consumer.consumer.list_topics(topic, timeout=15)
        info = metadata.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            raise KafkaError(f"topic {topic} does not exist: run `tributary run commands` once")
        partitions = self._partitions or sorted(info.partitions)
        with self.bus.store.engine.connect() as conn:
            stored = self.positions.load(conn, topic)
            marks = self.positions.load(conn, self.topics.results)
        if marks or not stored:  # (positions without marks: saved by an older version)
            self._published = self._published_since(marks)
        self._consumer.assign(
            [TopicPartition(topic, p, stored.get(p, OFFSET_BEGINNING)) for p in partitions]
        )
        self._assigned = True

    def _published_since(self, marks: dict[int, int]) -> set[bytes]:
        """The keys of the results the topic gained after the last saved batch: a processor
        that died before it saved its positions published them, and their commands come
        again. Empty when the topic ends below a mark (recreated, or records lost)."""
        try:
            tail = read_tail(self.kafka, self.topics.results, marks)
        except TopicRewoundError as exc:
            log.warning("results published before a restart are not known: %s", exc)
            return set()
        return {record.key for record in tail.records if record.key is not None}


class CommandClient:
    """Sends commands to the ``commands`` topic and, optionally, waits for their results."""

    def __init__(
        self,
        kafka: KafkaConfig,
        topics: CommandTopics | None = None,
        registry: CommandRegistry | None = None,
    ) -> None:
        self.kafka = kafka
        self.topics = topics or CommandTopics()
        self.registry = registry
        self._producer = idempotent_producer(kafka)

    def send(
        self,
        command_type: str,
        data: dict[str, Any],
        command_id: str | None = None,
        key: str | None = None,
    ) -> str:
        """Produce one command (flushed); returns its command id.

        The key defaults to the command's stream id when a registry is given and the
        command decodes, else to the command id.
        """
        command_id = command_id or str(uuid.uuid4())
        key = key or self._stream_key(command_type, data) or command_id
        envelope = CommandEnvelope(command_id, command_type, data)
        deliveries = Deliveries()
        self._producer.produce(
            self.topics.commands, key=key.encode(), value=envelope.to_json(), on_delivery=deliveries
        )
        failure = deliveries.confirm(self._producer, 30)
        if failure is not None:
            # e.g. the broker fenced this producer after it lost state: that is fatal to an
            # idempotent producer, so the next send starts a new one (sending again is safe:
            # the processor answers a known command id with its first result)
            if deliveries.failures:
                self._producer = idempotent_producer(self.kafka)
            raise KafkaError(
                f"command {command_id} not delivered to {self.topics.commands}: {failure}"
            )
        return command_id

    def send_and_wait(
        self,
        command_type: str,
        data: dict[str, Any],
        command_id: str | None = None,
        key: str | None = None,
        timeout: float = 30.0,
    ) -> CommandResult:
        """Send, then wait for the result on ``command-results``."""
        waiter = ResultWaiter(self.kafka, self.topics.results)
        try:
            sent_id = self.send(command_type, data, command_id, key)
            return waiter.wait(sent_id, timeout)
        finally:
            waiter.close()

    def _stream_key(self, command_type: str, data: dict[str, Any]) -> str | None:
        if self.registry is None:
            return None
        try:
            command = self.registry.decode(command_type, data)
            stream_id: str = self.registry.route(command).stream_id(command)
        except EventStoreError:
            return None
        return stream_id


class ResultWaiter:
    """Reads ``command-results`` from its end at creation time, looking for command ids."""

    def __init__(self, kafka: KafkaConfig, topic: str) -> None:
        self.topic = topic
        probe = probe_consumer(kafka)
        try:
            metadata = probe.list_topics(topic, timeout=15)
            info = metadata.topics.get(topic)
            if info is None or info.error is not None or not info.partitions:
                raise KafkaError(f"topic {topic} does not exist: start `tributary run commands`")
            marks = true_watermarks(
                probe, [(topic, p) for p in info.partitions], fresh=lambda: probe_consumer(kafka)
            )
        finally:
            probe.close()
        # read from the end: on Tansu a short fetch wait may not list that far (Follower)
        self._consumer = Follower(kafka, WAITER_CONSUMER, SHORT_WAIT_MS, f"result waiter {topic}")
        self._consumer.assign(
            [TopicPartition(topic, p, marks[(topic, p)][1]) for p in sorted(info.partitions)]
        )

    def wait(self, command_id: str, timeout: float = 30.0) -> CommandResult:
        """The result for ``command_id``; raises :class:`CommandTimeoutError` after ``timeout``."""
        deadline = time.monotonic() + timeout
        wanted = command_id.encode("utf-8", "surrogatepass")
        while time.monotonic() < deadline:
            for msg in self._consumer.consume(100, min(0.5, max(deadline - time.monotonic(), 0))):
                if msg.error() is not None or msg.key() != wanted:
                    continue
                value = msg.value()
                if value is not None:
                    return result_from_json(json.loads(value))
        raise CommandTimeoutError(
            f"no result for command {command_id} on {self.topic} within {timeout:.0f} s; "
            "is `tributary run commands` running?"
        )

    def close(self) -> None:
        self._consumer.close()
