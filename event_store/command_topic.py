"""The Kafka entry point: a processor for the ``commands`` topic and a client that sends to it.

Wire format: :mod:`event_store.command_wire`; the client that sends commands:
:mod:`event_store.command_client` (both re-exported here).

Position strategy. The processor reads *assigned* partitions (no consumer group: a group
join costs ~23 s on the local broker). Several processors divide the partitions through
:mod:`connectors.partition_owners` (ownership rows in PostgreSQL, a fence in every write's
transaction; see :class:`CommandProcessor`); everything below holds per partition. For each
batch it handles every message through the :class:`CommandBus`, produces each result,
flushes the producer, and only then stores the next offsets in PostgreSQL
(``consumer_positions``), with the end of the batch's results on the partition's results
partition in the same transaction. A crash anywhere re-reads at most the last batch, which
is harmless: the bus records every handled command id with its result in the same
transaction as its events, so a re-read command appends nothing and gets its first result; a
processor taking a partition first reads what its results partition gained after the stored
offset, and a command whose result is there already is not answered twice. Storing the
offset in the command's own transaction instead would lose the result of a command committed
just before a crash. Messages without a usable command id cannot be recorded; they are
rejected again, identically, and nothing is stored for them.

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

import contextlib
import json
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import sqlalchemy.exc
from confluent_kafka import OFFSET_BEGINNING, KafkaException, Producer, TopicPartition
from confluent_kafka import KafkaError as ClientError

from connectors.errors import KafkaError, TopicRewoundError
from connectors.kafka import KafkaConfig
from connectors.kafka.config import ClientValue
from connectors.kafka.following import Follower
from connectors.kafka.producing import IDEMPOTENT, Deliveries
from connectors.kafka.reading import read_tail
from connectors.partition_owners import PartitionFencedError
from connectors.partition_owners import fenced as fenced_error
from event_store.bus import CommandBus, Fence
from event_store.command import CommandResult, Rejected
from event_store.command_client import CommandClient, ResultWaiter
from event_store.command_wire import (
    MAX_COMMAND_ID_CHARS,
    CommandEnvelope,
    CommandTopics,
    ensure_topics,
    parse_envelope,
)
from event_store.consumer_positions import ConsumerPositions
from event_store.errors import (
    ConcurrencyError,
    EventStoreError,
    FencedError,
    MalformedCommandError,
    StorageError,
)
from event_store.faults import brief, command_fault, traceback_of
from event_store.outcomes import CommandObserver, CommandOutcome, Outcome
from event_store.prepared import StatementsLost

if TYPE_CHECKING:
    from connectors.partition_owners import Ownership

__all__ = [
    "MAX_COMMAND_ID_CHARS",
    "PROCESSOR_BATCH",
    "PROCESSOR_CONSUMER",
    "PROCESSOR_PRODUCER",
    "CommandClient",
    "CommandEnvelope",
    "CommandProcessor",
    "CommandTopics",
    "ResultWaiter",
    "ensure_topics",
    "handle_message",
    "parse_envelope",
]

log = logging.getLogger(__name__)


def handle_message(bus: CommandBus, value: bytes | None) -> CommandResult:
    """The result of one ``commands`` message; never raises for a bad message.

    Errors of the infrastructure (PostgreSQL unreachable, ...) do propagate: the message
    was not handled, and the processor must not move past it. Everything the message's
    content causes is its rejection (:func:`~event_store.faults.command_fault`).
    """
    return _handle(bus, value)[0]


def _handle(
    bus: CommandBus, value: bytes | None, fence: Fence | None = None
) -> tuple[CommandResult, Outcome]:
    try:
        envelope = parse_envelope(value)
    except MalformedCommandError as exc:
        return Rejected(exc.command_id, exc.reason), "rejected"
    try:
        command = bus.registry.decode(envelope.type, envelope.data)
        result = bus.send(command, envelope.command_id, fence)
        return result, "rejected" if isinstance(result, Rejected) else "accepted"
    except ConcurrencyError as exc:
        return Rejected(envelope.command_id, f"gave up after retries: {exc}"), "conflicting"
    except (StorageError, StatementsLost):
        raise  # the database failed, not the command: do not move past the message
    except EventStoreError as exc:  # a stored event that does not decode, ...
        return Rejected(envelope.command_id, str(exc)), "rejected"
    except Exception as exc:
        reason = command_fault(exc)
        if reason is None:
            raise
        log.warning(
            "command %s rejected: %s%s", brief(envelope.command_id), reason, traceback_of(exc)
        )
        return Rejected(envelope.command_id, reason), "rejected"


# The command processor's clients: positions are stored with the results in PostgreSQL (the
# truth it resumes from) and committed to its consumer group only for lag tools. The fetch wait
# starts short (Tansu holds an empty fetch for its whole wait) and lengthens when fetches stop
# bringing records below the end (on Tansu, a partition of one batch per command outgrows what
# a short wait lists): see connectors.kafka.following.
PROCESSOR_CONSUMER: dict[str, ClientValue] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
}
PROCESSOR_FETCH_WAIT_MS = 50
PROCESSOR_LINGER_MS = 5
PROCESSOR_PRODUCER: dict[str, ClientValue] = {**IDEMPOTENT, "linger.ms": PROCESSOR_LINGER_MS}
PROCESSOR_BATCH = 500  # most commands handled per batch
#: What a broker answers a producer that a newer one of its ``transactional.id`` replaced.
PRODUCER_FENCED = (
    ClientError._FENCED,
    ClientError.PRODUCER_FENCED,
    ClientError.INVALID_PRODUCER_EPOCH,
)


class CommandProcessor:
    """Consumes ``commands``, handles each through the bus, produces to ``command-results``.

    After each batch's positions are stored, they are also committed as the consumer group
    ``consumer_name`` (asynchronously, never read back), so ``kafka-consumer-groups``, Kafka UI
    and Burrow show the processor's lag. ``observer`` hears of every command handled
    (:class:`~event_store.outcomes.CommandOutcome`, entry ``topic``).

    Alone (no ``ownership``), it reads every partition (or ``partitions``). With an
    :class:`~connectors.partition_owners.Ownership`, several processors share the topic: each
    reads the partitions its ownership holds, takes and gives back partitions as processors
    join and leave (between batches), and every write it makes for a partition — each
    command's transaction, the stored positions — carries the partition's fence, so a
    processor that lost a partition (paused past the timeout, then resumed) stores nothing
    more for it. The result of a command read from partition ``p`` goes to partition
    ``p mod n`` of ``command-results`` (``n`` its partitions): the results a partition's
    owners published are on one partition, so a new owner reads only that one to learn which
    results its predecessor published after its last stored batch.

    With an ownership and ``exactly_once`` (an opt-in, as Kafka Streams' ``exactly_once_v2``
    is: it adds about a second to a take-over, measured; librdkafka's fixed 500 ms retry of the
    producer id, see :meth:`_transactional_producer`), the results of each owned partition
    go through a transactional producer of that partition (``transactional.id``: the group,
    the topic and the partition), one transaction per batch, committed before the batch's
    positions are stored. A processor taking a partition initialises that producer first
    (``init_transactions``), which fences the previous owner's: a result a paused owner had
    handed to its producer but not yet sent is refused when it wakes (``PRODUCER_FENCED``)
    instead of answering the command a second time after the new owner did; on Kafka, what it
    sent in a transaction it never committed is aborted, and ``read_committed`` readers
    (librdkafka's default) never see it. Without it, such a result goes out when the paused
    processor wakes: the command is answered twice, never stored twice.
    """

    def __init__(
        self,
        bus: CommandBus,
        kafka: KafkaConfig,
        topics: CommandTopics | None = None,
        consumer_name: str = "command-processor",
        partitions: Sequence[int] | None = None,
        batch_size: int = PROCESSOR_BATCH,
        observer: CommandObserver | None = None,
        ownership: "Ownership | None" = None,
        rebalance_every_s: float = 0.5,
        linger_ms: int = PROCESSOR_LINGER_MS,
        exactly_once: bool = False,
    ) -> None:
        if exactly_once and ownership is None:  # it fences through the partitions' owners
            raise EventStoreError(
                "exactly_once needs an ownership: the transactional producer of a partition is"
                " initialised by the processor that takes it (pass ownership=...)"
            )
        self.bus = bus
        self.group = consumer_name
        self.observer = observer
        self._group_warned = False
        self.kafka = kafka
        self.topics = topics or CommandTopics()
        self.positions = ConsumerPositions(bus.store.tables, consumer_name)
        self.batch_size = batch_size
        self.handled = 0
        self.ownership = ownership
        #: results through a transactional producer per owned partition (needs an ownership)
        self.exactly_once = exactly_once
        self.rebalance_every_s = rebalance_every_s
        self._next_rebalance = 0.0
        self._stop = threading.Event()
        self._consumer = Follower(
            kafka,
            {"group.id": consumer_name, **PROCESSOR_CONSUMER},
            PROCESSOR_FETCH_WAIT_MS,
            f"command processor {consumer_name}",
        )
        self._producer_properties = {**PROCESSOR_PRODUCER, "linger.ms": linger_ms}
        self._producer = Producer(kafka.client_properties(**self._producer_properties))
        # with exactly_once: per owned partition, its results' transactional producer
        self._producers: dict[int, Producer] = {}
        self._partitions = list(partitions) if partitions is not None else None
        self._assigned = False
        self._results_partitions = 0
        self._reading: set[int] = set()  # the commands partitions read now
        # per commands partition: results on the topic its saved batches lack
        self._published: dict[int, set[bytes]] = {}

    @property
    def reading(self) -> set[int]:
        """The partitions of ``commands`` this processor reads now."""
        return set(self._reading)

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
        if self.ownership is not None:
            self.ownership.polled()
        self._assign()
        # Wait for the first message only; then take what is already fetched. (consume(n, t)
        # would wait the whole timeout whenever fewer than n messages are there.)
        first = self._consumer.poll(timeout)
        if first is None:
            return 0
        messages = [first, *self._consumer.consume(self.batch_size - 1, 0)]
        next_offsets: dict[int, int] = {}
        fenced: set[int] = set()
        handled = 0
        deliveries: dict[int, Deliveries] = {}  # per commands partition of the batch
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise KafkaError(f"consuming {self.topics.commands}: {err.str()}", err.name())
                log.warning("consume error on %s: %s", self.topics.commands, err.str())
                continue
            partition, offset = msg.partition(), msg.offset()
            if partition is None or offset is None or partition in fenced:
                continue
            try:
                result = self._handle(msg.value(), self._fence(partition))
            except (FencedError, PartitionFencedError) as exc:
                log.warning("partition %d lost, its command not handled here: %s", partition, exc)
                fenced.add(partition)
                continue
            # a command id read from JSON may hold a lone surrogate: keep it, byte for byte
            key = (
                None
                if result.command_id is None
                else result.command_id.encode("utf-8", "surrogatepass")
            )
            published = self._published.setdefault(partition, set())
            if key is not None and key in published:
                published.discard(key)  # published before a crash: not twice
            else:
                producer = self._producer_of(partition, partition not in deliveries)
                producer.produce(
                    self.topics.results,
                    key=key,
                    value=json.dumps(result.to_json()).encode(),
                    partition=self._results_partition(partition),
                    on_delivery=deliveries.setdefault(partition, Deliveries()),
                )
                producer.poll(0)
            next_offsets[partition] = offset + 1
            handled += 1
        ends = self._confirm(deliveries, fenced)
        saved = self._save(next_offsets, ends, fenced)
        self._drop(fenced)
        self._commit_group(saved)
        self.handled += handled
        return handled

    def _producer_of(self, partition: int, first: bool) -> Producer:
        """The producer of ``partition``'s results; with ``exactly_once``, its transactional
        producer, in a transaction begun with the batch's ``first`` result of the partition."""
        if not self.exactly_once:
            return self._producer
        producer = self._producers[partition]
        if first:
            producer.begin_transaction()
        return producer

    def _confirm(self, deliveries: dict[int, Deliveries], fenced: set[int]) -> dict[int, int]:
        """Every result of the batch acknowledged (with ``exactly_once``: each partition's
        transaction committed); returns the end of the batch's results per results partition.
        A partition whose producer was fenced (a new owner took it) is added to ``fenced``.
        Raises :class:`KafkaError` when results were not delivered: the batch is read again."""
        ends: dict[int, int] = {}
        for partition, batch in deliveries.items():
            if not self.exactly_once:
                failure = batch.confirm(self._producer, 30)
            else:
                failure = self._commit(partition, batch, fenced)
                if failure is None and partition not in self._producers:
                    fenced.add(partition)
                    continue
            if failure is not None:  # not acknowledged: stop before saving positions, re-read
                raise KafkaError(f"results not delivered to {self.topics.results}: {failure}")
            for (topic, p), end in batch.ends.items():
                if topic == self.topics.results:
                    ends[p] = max(ends.get(p, 0), end)
        return ends

    def _commit(self, partition: int, batch: Deliveries, fenced: set[int]) -> str | None:
        """Commit ``partition``'s transaction; None when committed, or when the partition is
        no longer this processor's (then its producer is dropped, the transaction never
        committed: a new owner has the partition, read from the stored positions); else why
        not (the transaction aborted, or the producer failed otherwise).

        No longer this processor's: the fence refused a command of the batch, or the
        heartbeat found the partition taken (a processor paused past its timeout), or the
        broker refused the commit as fenced. A broker may also let a fenced producer's commit
        time out instead of refusing it (Tansu: after the 30 s); that failure is a loss too
        when the partition was taken meanwhile."""
        producer = self._producers[partition]
        if partition in fenced or self._taken(partition):
            log.warning("partition %d lost, its results not committed", partition)
            del self._producers[partition]
            return None
        try:
            producer.commit_transaction(30)
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() in PRODUCER_FENCED or self._taken(partition):
                log.warning("partition %d lost, its results refused: %s", partition, error.str())
                del self._producers[partition]
                return None
            if error.txn_requires_abort():
                with contextlib.suppress(KafkaException):
                    producer.abort_transaction(30)
            return str(error.str())
        return batch.failures[0] if batch.failures else None

    def _taken(self, partition: int) -> bool:
        """Whether the heartbeat found ``partition`` taken by another owner."""
        return self.ownership is not None and partition not in self.ownership.owned

    def _fence(self, partition: int) -> Fence | None:
        return None if self.ownership is None else self.ownership.fence(partition)

    def _results_partition(self, partition: int) -> int:
        return partition % self._results_partitions

    def _save(
        self, next_offsets: dict[int, int], ends: dict[int, int], fenced: set[int]
    ) -> dict[int, int]:
        """Store each partition's next offset with the end of its results (the mark a new
        owner reads the results topic from), each partition in a transaction of its own with
        its fence; a partition the fence refuses is added to ``fenced``."""
        saved: dict[int, int] = {}
        for partition, offset in sorted(next_offsets.items()):
            if partition in fenced:
                continue
            end = ends.get(self._results_partition(partition))
            try:
                with self.bus.store.engine.begin() as conn:
                    fence = self._fence(partition)
                    if fence is not None:
                        conn.exec_driver_sql(fence[0], dict(fence[1]))
                    self.positions.save(conn, self.topics.commands, {partition: offset})
                    if end is not None:
                        self.positions.save(conn, self.topics.results, {partition: end})
            except sqlalchemy.exc.DBAPIError as exc:
                if not (isinstance(exc.orig, BaseException) and fenced_error(exc.orig)):
                    raise
                log.warning("partition %d lost, its positions not stored: %s", partition, exc)
                fenced.add(partition)
                continue
            except PartitionFencedError:
                fenced.add(partition)
                continue
            saved[partition] = offset
        return saved

    def _handle(self, value: bytes | None, fence: Fence | None = None) -> CommandResult:
        began, conflicts = time.perf_counter(), self.bus.conflicts
        result, outcome = _handle(self.bus, value, fence)
        if self.observer is not None:
            took = time.perf_counter() - began
            self.observer(CommandOutcome("topic", outcome, took, self.bus.conflicts - conflicts))
        return result

    def _commit_group(self, next_offsets: dict[int, int]) -> None:
        """Show the stored positions to lag tools (best effort: a failure is logged once)."""
        if not next_offsets:
            return
        parts = [TopicPartition(self.topics.commands, p, o) for p, o in next_offsets.items()]
        try:
            self._consumer.consumer.commit(offsets=parts, asynchronous=True)
        except Exception as exc:  # confluent_kafka.KafkaException: lag tools only
            if not self._group_warned:
                log.warning("positions not committed as group %s: %s", self.group, exc)
                self._group_warned = True

    def close(self) -> None:
        self._producer.flush(30)
        self._consumer.close()
        if self.ownership is not None:
            self.ownership.leave()

    def _assign(self) -> None:
        if not self._assigned:
            self._partitions = self._metadata()
            self._assigned = True
            if self.ownership is None:
                self._take(self._partitions)
        if self.ownership is not None and time.monotonic() >= self._next_rebalance:
            self._next_rebalance = time.monotonic() + self.rebalance_every_s
            self._drop(self.ownership.lost())
            give_back, taken = self.ownership.rebalance()
            if give_back:  # stop reading them, then free them (release needs their epochs)
                self._drop(set(give_back), forget=False)
                self.ownership.release(give_back)
            if taken:
                self._take(sorted(taken))

    def _metadata(self) -> list[int]:
        """The partitions of ``commands`` (those asked for, if any); notes the results'."""
        found: dict[str, list[int]] = {}
        for topic in (self.topics.commands, self.topics.results):
            metadata = self._consumer.consumer.list_topics(topic, timeout=15)
            info = metadata.topics.get(topic)
            if info is None or info.error is not None or not info.partitions:
                raise KafkaError(f"topic {topic} does not exist: run `tributary run commands` once")
            found[topic] = sorted(info.partitions)
        self._results_partitions = len(found[self.topics.results])
        return self._partitions or found[self.topics.commands]

    def _take(self, partitions: list[int]) -> None:
        """Start reading ``partitions`` from their stored positions, knowing which results
        their previous owners published after their last stored batch."""
        topic = self.topics.commands
        with self.bus.store.engine.connect() as conn:
            stored = self.positions.load(conn, topic)
            marks = self.positions.load(conn, self.topics.results)
        if self.exactly_once and partitions:  # fence the previous owners' results before
            # reading them; side by side, as each producer's first requests wait on the broker
            with ThreadPoolExecutor(len(partitions), "results-producers") as pool:
                ready = pool.map(self._transactional_producer, partitions)
                self._producers.update(zip(partitions, ready, strict=True))
        for p in partitions:
            # (a position without a mark: saved by an older version, which kept no marks)
            if p in marks or p not in stored:
                self._published[p] = self._published_since(p, marks.get(p))
        self._consumer.reassign(
            [TopicPartition(topic, p, stored.get(p, OFFSET_BEGINNING)) for p in partitions], []
        )
        self._reading.update(partitions)
        if self.ownership is not None:
            log.info("%s: now reading partitions %s", self.group, sorted(self._reading))

    def _drop(self, partitions: set[int], forget: bool = True) -> None:
        """Stop reading partitions (lost, refused by their fence, or to be given back)."""
        gone = partitions & self._reading
        if not gone:
            return
        if self.ownership is not None and forget:
            self.ownership.forget(gone)
        self._consumer.reassign([], [(self.topics.commands, p) for p in gone])
        self._reading -= gone
        for p in gone:
            self._published.pop(p, None)
            self._producers.pop(p, None)
        log.info("%s: stopped reading partitions %s", self.group, sorted(gone))

    def _transactional_producer(self, partition: int) -> Producer:
        """``partition``'s results producer, initialised: any earlier producer of the partition
        (its previous owner's) is fenced from now on."""
        txn_id = f"{self.group}.{self.topics.commands}.{partition}"
        producer = Producer(
            self.kafka.client_properties(
                **self._producer_properties, **{"transactional.id": txn_id}
            )
        )
        try:
            # 0.06 s, or 0.5 s in about half the cases: librdkafka asks for the producer id
            # again on a fixed 500 ms timer when the transaction coordinator's connection is not
            # up yet (rdkafka_idempotence.c), and a metadata request first does not change it
            # (bench/txn_init.py). A new owner waits for the slowest of its partitions.
            producer.init_transactions(30)
        except KafkaException as exc:
            raise KafkaError(
                f"results producer of partition {partition} not ready: {exc.args[0].str()}",
                exc.args[0].name(),
            ) from exc
        return producer

    def _published_since(self, partition: int, mark: int | None) -> set[bytes]:
        """The keys of the results its partition of the results topic gained after the last
        saved batch: a processor that died before it saved its positions published them, and
        their commands come again. Empty when the topic ends below the mark (recreated, or
        records lost)."""
        results = self._results_partition(partition)
        since = {} if mark is None else {results: mark}
        try:
            tail = read_tail(self.kafka, self.topics.results, since, only=[results])
        except TopicRewoundError as exc:
            log.warning("results published before a restart are not known: %s", exc)
            return set()
        return {record.key for record in tail.records if record.key is not None}
