"""The registry's store: its compacted topic (one partition), read by a thread into the state.

At start the reader reads the topic from offset 0; a NOOP record marks where "now" is, so
catching up never depends on ListOffsets (which some Kafka-protocol brokers under-report):
the store produces the marker, takes its offset from the delivery report and waits until the
reader has passed it. Writes are produced by an idempotent producer (acks=all) and return
once the reader has applied them, so every instance on the topic folds the same records in
the same order.
"""

import logging
import threading
import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka import KafkaError as RdKafkaError

from connectors.kafka.admin import TopicAdmin
from connectors.kafka.config import ClientValue, KafkaConfig
from connectors.kafka.fetching import longer_wait, range_fetch, shorter_wait, stall_s
from connectors.kafka.producing import idempotent_producer
from connectors.kafka.topics import state_topic
from connectors.schema_registry.errors import RegistryStoreError, RegistryTimeoutError
from connectors.schema_registry.records import NOOP_KEY, RegistryState
from connectors.schema_registry.registry import SchemaRegistry

log = logging.getLogger(__name__)

DEFAULT_TOPIC = "_schemas"


TAIL_FETCH_WAIT_MS = 10
STEP_DOWN_AFTER_S = 30.0
"""How long the reader keeps a lengthened fetch wait before it tries the next shorter one."""
IDLE_FETCH_WAIT_MS = 500
"""The reader's fetch wait while no writer waits (others' writes show within about this)."""
IDLE_AFTER_S = 2.0
"""How long after the last waiting writer the reader takes the idle wait."""


@dataclass
class TailWait:
    """The registry reader's fetch wait, decided from what each poll saw (no I/O: see
    :meth:`KafkaSchemaLog._read` for why each rule is there).

    ``writers_ms`` is the wait a waiting writer is served with: it lengthens while a writer
    waits and fetches bring nothing, and steps back down after :data:`STEP_DOWN_AFTER_S`
    while none waits. ``reading_ms`` is the wait of the consumer now: ``writers_ms``, or
    :data:`IDLE_FETCH_WAIT_MS` once no writer waited for :data:`IDLE_AFTER_S`."""

    writers_ms: int
    now: float
    reading_ms: int = 0
    idle: bool = False
    quiet_until: float = 0.0
    changed_at: float = 0.0
    last_busy: float = 0.0

    def __post_init__(self) -> None:
        self.reading_ms = self.writers_ms
        self.quiet_until = self.now + stall_s(self.writers_ms)
        self.changed_at = self.last_busy = self.now

    def seen(self, now: float, waiting: bool, records: bool) -> int | None:
        """After a poll: the wait to open the consumer again with, or None to keep it.
        ``waiting``: a writer waits for a record not read yet; ``records``: the poll brought
        some."""
        if waiting:
            self.last_busy = now
        if records:
            self.quiet_until = now + stall_s(self.reading_ms)
        if self.idle and waiting:  # a writer waits: the writers' wait again
            self.idle = False
            return self._open(now, self.writers_ms)
        if not self.idle and waiting and not records and now > self.quiet_until:
            self.writers_ms = longer_wait(self.writers_ms)
            self.changed_at = now
            return self._open(now, self.writers_ms)
        if (
            not waiting
            and self.writers_ms > TAIL_FETCH_WAIT_MS
            and now - self.changed_at > STEP_DOWN_AFTER_S
        ):
            self.writers_ms = shorter_wait(self.writers_ms, TAIL_FETCH_WAIT_MS)
            self.changed_at = now
            return None if self.idle else self._open(now, self.writers_ms)
        if (
            not self.idle
            and not waiting
            and now - self.last_busy > IDLE_AFTER_S
            and self.writers_ms < IDLE_FETCH_WAIT_MS
        ):
            self.idle = True
            return self._open(now, IDLE_FETCH_WAIT_MS)
        return None

    def _open(self, now: float, wait_ms: int) -> int:
        self.reading_ms = wait_ms
        self.quiet_until = now + stall_s(wait_ms)
        return wait_ms


class KafkaSchemaLog:
    """The topic as the registry's :class:`~connectors.schema_registry.registry.SchemaLog`."""

    def __init__(
        self,
        kafka: KafkaConfig,
        state: RegistryState,
        topic: str = DEFAULT_TOPIC,
        timeout: float = 30.0,
        fetch_wait_ms: int | None = None,
    ) -> None:
        self.kafka = kafka
        self.state = state
        self.topic = topic
        self.timeout = timeout
        self._applied = 0  # the next offset the reader will apply
        # the writers' fetch wait the reader starts with (it lengthens under load)
        first_wait = TAIL_FETCH_WAIT_MS if fetch_wait_ms is None else fetch_wait_ms
        self.tail = TailWait(first_wait, time.monotonic())  # the reader's, once it runs
        self._wanted = 0  # the offset a writer waits for the reader to pass
        self._progress = threading.Condition()
        self._stop = threading.Event()
        self._failure: str | None = None
        self._thread: threading.Thread | None = None
        self._producer: Producer | None = None

    def start(self) -> None:
        """Create the topic if needed, start the reader and catch up with the topic's end."""
        admin = TopicAdmin(self.kafka)
        admin.ensure(state_topic(self.topic, 1))
        partitions = admin.partition_count(self.topic)
        if partitions != 1:
            raise RegistryStoreError(
                f"topic {self.topic} has {partitions} partitions; the registry's store needs"
                " exactly one (choose another topic with TRIBUTARY_SCHEMA_REGISTRY_TOPIC)"
            )
        producer: dict[str, ClientValue] = {"acks": "all", "linger.ms": 0}
        self._producer = idempotent_producer(self.kafka, producer)
        self._thread = threading.Thread(target=self._read, name="schema-registry-reader")
        self._thread.daemon = True
        self._thread.start()
        self.sync()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None  # librdkafka's threads end with the object

    @property
    def applied_offset(self) -> int:
        return self._applied

    # -- SchemaLog ------------------------------------------------------------------------

    def append(self, key: bytes, value: bytes | None) -> None:
        self._wait_applied(self._produce(key, value))

    def sync(self) -> None:
        self._wait_applied(self._produce(NOOP_KEY, None))

    # -- inside ---------------------------------------------------------------------------

    def _produce(self, key: bytes, value: bytes | None) -> int:
        if self._producer is None:
            raise RegistryStoreError("the schema store is not started")
        outcome: dict[str, Message | RdKafkaError | None] = {}

        def delivered(err: RdKafkaError | None, msg: Message) -> None:
            outcome["error"] = err
            outcome["message"] = msg

        self._producer.produce(self.topic, value=value, key=key, partition=0, on_delivery=delivered)
        self._producer.flush(self.timeout)
        error, message = outcome.get("error"), outcome.get("message")
        if isinstance(error, RdKafkaError):
            raise RegistryStoreError(f"writing to {self.topic} failed: {error.str()}")
        if not isinstance(message, Message) or message.offset() is None:
            raise RegistryTimeoutError(
                f"writing to {self.topic} was not acknowledged in {self.timeout:.0f}s:"
                " is Kafka reachable?"
            )
        return int(message.offset() or 0)

    def _wait_applied(self, offset: int) -> None:
        deadline = time.monotonic() + self.timeout
        with self._progress:
            self._wanted = max(self._wanted, offset + 1)
            while self._applied <= offset:
                if self._failure is not None:
                    raise RegistryStoreError(f"reading {self.topic} failed: {self._failure}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RegistryTimeoutError(
                        f"the registry did not read {self.topic} up to offset {offset} in"
                        f" {self.timeout:.0f}s (read up to {self._applied})"
                    )
                self._progress.wait(min(left, 0.5))

    def _consumer(self, wait_ms: int) -> Consumer:
        props: dict[str, ClientValue] = {
            "group.id": f"tributary-schema-registry-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **range_fetch(wait_ms, 64),
        }
        consumer = Consumer(self.kafka.client_properties(**props))
        consumer.assign([TopicPartition(self.topic, 0, self._applied)])
        return consumer

    def _read(self) -> None:
        """Apply the topic's records as they come, with the fetch wait the moment needs.

        On Tansu a fetch may be held for its whole wait when the records it lists are fewer
        than its byte budget (``connectors.kafka.fetching``), so a writer may wait about the
        reader's fetch wait for its own record; and a reader tailing with a short wait keeps
        the broker busy (a fetch every 10 ms: about 8% of a core of an idle broker). So the
        reader tails with a short wait while a writer waits or wrote lately, and with
        :data:`IDLE_FETCH_WAIT_MS` after :data:`IDLE_AFTER_S` without one; a writer wakes it
        within a poll (on the in-memory broker the idle fetch often brings the record first).

        Each registration is a batch of its own; on Tansu a short wait can stop bringing
        records below the end of a log of many small batches, so while a writer waits and
        fetches bring nothing, the consumer is opened again at the applied offset with a longer
        wait (``connectors.kafka.fetching``). A lengthened wait is kept for
        :data:`STEP_DOWN_AFTER_S`, then, while no writer waits, the next shorter one is tried
        (a stall there lengthens it again)."""
        tail = self.tail = TailWait(self.tail.writers_ms, time.monotonic())
        consumer = self._consumer(tail.reading_ms)
        try:
            while not self._stop.is_set():
                # wait for the first record only, then take what is fetched (consume(n, t)
                # waits the whole timeout whenever fewer than n records are there)
                first = consumer.poll(0.05)
                messages = [] if first is None else [first, *consumer.consume(499, 0)]
                reopen = tail.seen(time.monotonic(), self._wanted > self._applied, bool(messages))
                for msg in messages:
                    err = msg.error()
                    if err is not None:
                        if err.code() != RdKafkaError._PARTITION_EOF:
                            log.warning("reading %s: %s", self.topic, err.str())
                            if err.fatal():
                                self._fail(err.str())
                                return
                        continue
                    self._fold(msg)
                if reopen is not None:  # at the applied offset, after folding what came
                    consumer.close()
                    consumer = self._consumer(reopen)
        except Exception as exc:  # the reader must never die silently: writers wait on it
            log.exception("the schema registry's reader stopped")
            self._fail(str(exc))
        finally:
            consumer.close()

    def _fold(self, msg: Message) -> None:
        offset = int(msg.offset() or 0)
        try:
            self.state.apply(msg.key(), msg.value())
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("skipping malformed record at %s[0]@%d: %s", self.topic, offset, exc)
        with self._progress:
            self._applied = max(self._applied, offset + 1)
            self._progress.notify_all()

    def _fail(self, reason: str) -> None:
        with self._progress:
            self._failure = reason
            self._progress.notify_all()


def open_registry(
    kafka: KafkaConfig, topic: str = DEFAULT_TOPIC, timeout: float = 30.0
) -> tuple[SchemaRegistry, KafkaSchemaLog]:
    """A registry on ``topic``, caught up with it (close the log when done)."""
    state = RegistryState()
    store = KafkaSchemaLog(kafka, state, topic, timeout)
    store.start()
    return SchemaRegistry(state, store), store
