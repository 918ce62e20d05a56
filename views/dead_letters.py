"""Dead letters: records a view could not use go to the view's own topic ``dlq.<view>`` with
the reason in headers, and the view moves on.

One topic per view, so two views reading one topic never share an anonymous dead-letter queue.
The record keeps its key, value and headers (a record the store refused carries the fields it
could not write); added headers: ``tributary.error.reason``, ``tributary.error.stage``
(``decode``: the fold refused it; ``write``: the store did), ``tributary.view``,
``tributary.source.topic``, ``tributary.source.partition``, ``tributary.source.offset``.
Dead letters are sent and flushed before the store commits the batch: at-least-once (a batch
retried after a crash sends its dead letters again, with the same source coordinates).
"""

import threading
from collections.abc import Sequence

from confluent_kafka import Producer

from connectors.kafka import KafkaConfig, TopicAdmin, history_topic
from projections.view import DeadLetter
from views.errors import DeadLetterError

DLQ_PREFIX = "dlq."
REASON_HEADER = "tributary.error.reason"


def dlq_topic(view: str) -> str:
    """The dead-letter topic of a view."""
    return DLQ_PREFIX + view


def error_headers(view: str, letter: DeadLetter) -> list[tuple[str, str | bytes | None]]:
    """The headers that say why and where a record was rejected."""
    return [
        (REASON_HEADER, letter.reason.encode()),
        ("tributary.error.stage", letter.stage.encode()),
        ("tributary.view", view.encode()),
        ("tributary.source.topic", letter.topic.encode()),
        ("tributary.source.partition", str(letter.partition).encode()),
        ("tributary.source.offset", str(letter.offset).encode()),
    ]


class DeadLetterQueue:
    """Sends one view's dead letters to ``dlq.<view>`` (created on first use)."""

    def __init__(self, kafka: KafkaConfig, view: str, timeout: float = 30.0) -> None:
        self.kafka = kafka
        self.view = view
        self.topic = dlq_topic(view)
        self.timeout = timeout
        self._producer: Producer | None = None
        self._ready = False
        self._lock = threading.Lock()  # a view's stores apply (and reject) in parallel

    def send(self, letters: Sequence[DeadLetter]) -> None:
        """Produce and flush; raises :class:`DeadLetterError` if any record is not acknowledged."""
        if not letters:
            return
        with self._lock:
            self._send(letters)

    def _send(self, letters: Sequence[DeadLetter]) -> None:
        if not self._ready:
            TopicAdmin(self.kafka).ensure(history_topic(self.topic))
            self._ready = True
        if self._producer is None:
            self._producer = Producer(
                self.kafka.client_properties(**{"enable.idempotence": True, "linger.ms": 5})
            )
        failures: list[str] = []

        def delivered(err: object, _msg: object) -> None:
            if err is not None:
                failures.append(str(err))

        for letter in letters:
            self._producer.produce(
                self.topic,
                key=letter.key,
                value=letter.value,
                headers=error_headers(self.view, letter),
                on_delivery=delivered,
            )
        left = self._producer.flush(self.timeout)
        if failures or left:
            raise DeadLetterError(
                f"view {self.view}: dead-letter delivery to {self.topic} failed ({left} unsent,"
                f" errors: {failures[:3]}); the batch is retried when the job restarts"
            )
