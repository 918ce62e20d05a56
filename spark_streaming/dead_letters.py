"""The dead-letter queue: records a view could not use go to ``<topic>.dlq`` with the reason in
headers, and the view moves on.

Headers added (original headers kept): ``tributary.error.reason``, ``tributary.error.class``,
``tributary.error.stage`` (decode or project), ``tributary.view``, ``tributary.source.topic``,
``tributary.source.partition``, ``tributary.source.offset``. Delivery is at-least-once: a batch
retried after a crash sends its rejections again.
"""

from collections.abc import Sequence

from confluent_kafka import Producer

from connectors.kafka import KafkaConfig, TopicAdmin, history_topic
from projections.view import Rejection
from spark_streaming.errors import StreamingError

DLQ_SUFFIX = ".dlq"
REASON_HEADER = "tributary.error.reason"


def dlq_topic(topic: str) -> str:
    """The dead-letter topic of a topic."""
    return topic + DLQ_SUFFIX


def error_headers(view: str, rejection: Rejection) -> list[tuple[str, bytes]]:
    """The headers that say why and where a record was rejected."""
    record = rejection.record
    return [
        (REASON_HEADER, rejection.reason.encode()),
        ("tributary.error.class", type(rejection.error).__name__.encode()),
        ("tributary.error.stage", rejection.stage.encode()),
        ("tributary.view", view.encode()),
        ("tributary.source.topic", record.topic.encode()),
        ("tributary.source.partition", str(record.partition).encode()),
        ("tributary.source.offset", str(record.offset).encode()),
    ]


class DeadLetterQueue:
    """Sends rejected records of one view to their topics' ``.dlq`` topics (created on demand)."""

    def __init__(self, kafka: KafkaConfig, view: str, timeout: float = 30.0) -> None:
        self.kafka = kafka
        self.view = view
        self.timeout = timeout
        self._producer: Producer | None = None
        self._ready: set[str] = set()

    def send(self, rejections: Sequence[Rejection]) -> None:
        """Produce and flush; raises :class:`StreamingError` if any record is not acknowledged."""
        if not rejections:
            return
        if self._producer is None:
            self._producer = Producer(
                self.kafka.client_properties(**{"enable.idempotence": True, "linger.ms": 5})
            )
        failures: list[str] = []

        def delivered(err: object, _msg: object) -> None:
            if err is not None:
                failures.append(str(err))

        for rejection in rejections:
            topic = dlq_topic(rejection.record.topic)
            if topic not in self._ready:
                TopicAdmin(self.kafka).ensure(history_topic(topic))
                self._ready.add(topic)
            record = rejection.record
            headers: list[tuple[str, str | bytes | None]] = list(record.headers)
            headers.extend(error_headers(self.view, rejection))
            self._producer.produce(
                topic, key=record.key, value=record.value, headers=headers, on_delivery=delivered
            )
        left = self._producer.flush(self.timeout)
        if failures or left:
            raise StreamingError(
                f"view {self.view}: dead-letter delivery failed ({left} unsent, errors:"
                f" {failures[:3]}); the batch is retried when the job restarts"
            )
