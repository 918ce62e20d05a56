"""Sending commands to the ``commands`` topic and waiting for their results on
``command-results`` (what ``tributary command`` and services without HTTP use).

Light on purpose: it needs the Kafka client and the result model, not the store's drivers, so
a short-lived process (the CLI) starts fast.
"""

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from confluent_kafka import Producer, TopicPartition

from connectors.errors import KafkaError
from connectors.kafka import KafkaConfig
from connectors.kafka.config import ClientValue
from connectors.kafka.fetching import SHORT_WAIT_MS
from connectors.kafka.following import Follower
from connectors.kafka.offsets import probe_consumer, true_watermarks
from connectors.kafka.producing import Deliveries, idempotent_producer, ordered_producer
from event_store.command import CommandResult, result_from_json
from event_store.command_wire import CommandEnvelope, CommandTopics
from event_store.errors import CommandTimeoutError, EventStoreError

if TYPE_CHECKING:
    from event_store.registry import CommandRegistry


class CommandClient:
    """Sends commands to the ``commands`` topic and, optionally, waits for their results.

    ``one_shot``: for a process that sends a command or two and exits (`tributary command`):
    its producer is not idempotent (:func:`~connectors.kafka.producing.ordered_producer`),
    which saves the half second an idempotent producer's first send waits for its producer id.
    A command a retry delivers twice is answered once: the processor records each command id
    with its result, and answers a known one with that result."""

    def __init__(
        self,
        kafka: KafkaConfig,
        topics: CommandTopics | None = None,
        registry: "CommandRegistry | None" = None,
        *,
        one_shot: bool = False,
    ) -> None:
        self.kafka = kafka
        self.topics = topics or CommandTopics()
        self.registry = registry
        self.one_shot = one_shot
        self._producer = self._new_producer()

    def _new_producer(self) -> Producer:
        return ordered_producer(self.kafka) if self.one_shot else idempotent_producer(self.kafka)

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
                self._producer = self._new_producer()
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


# A result waiter's consumer: group-less, assigned, never commits; its wait starts short.
WAITER_CONSUMER: dict[str, ClientValue] = {
    "group.id": "tributary-result-waiter",
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
}


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
            for msg in self._consumer.take(100, min(0.5, max(deadline - time.monotonic(), 0))):
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
