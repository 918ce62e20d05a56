"""The baselines of ``bench/load.py``: each path's transport with no command handling.

- ``run_echo``: a plain request/reply echo on the broker (confluent-kafka consumer and
  producer, no event store, no bus): it reads the request topic as ``CommandProcessor``
  reads ``commands`` (assigned partitions, the processor's consumer and producer
  properties, the same batch loop: poll for the first record, take what is fetched,
  produce one reply per record, flush) and answers each record with a reply keyed by its
  command id, as the processor answers on ``command-results``. It does not store positions
  (that is a PostgreSQL write, the processor's own cost).
- ``run_no_store_api``: the HTTP API as the load runs it (``create_app`` under the same
  uvicorn config), over a bus that decodes and routes the command and answers
  ``accepted`` without touching PostgreSQL.

The diagnostic of the reply reader is ``infra.command_results.Results`` with its
``fetch_wait_ms`` set (by default it leaves librdkafka's 500 ms).
"""

import json
import signal
import threading
import uuid
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition

from connectors.kafka.following import Follower
from event_store.command import Accepted
from event_store.command_topic import (
    PROCESSOR_BATCH,
    PROCESSOR_CONSUMER,
    PROCESSOR_FETCH_WAIT_MS,
    PROCESSOR_PRODUCER,
)
from infra.commands import command_topics
from infra.settings import Settings

LIBRDKAFKA_DEFAULT_FETCH_WAIT_MS = 500


def echo_settings(settings: Settings) -> Settings:
    """The same settings with the echo's request and reply topics instead of the command
    topics (as many partitions)."""
    return settings.model_copy(
        update={
            "commands_topic": "load-echo-requests",
            "command_results_topic": "load-echo-replies",
        }
    )


def run_echo(settings: Settings, out: Any) -> None:
    """Child process: answer every request record with a reply, as the processor does."""
    topics = command_topics(settings)
    kafka = settings.kafka("load-echo")
    consumer = Follower(
        kafka, {"group.id": "load-echo", **PROCESSOR_CONSUMER}, PROCESSOR_FETCH_WAIT_MS, "load echo"
    )
    producer = Producer(kafka.client_properties(**PROCESSOR_PRODUCER))
    consumer.assign(
        [TopicPartition(topics.commands, p, OFFSET_BEGINNING) for p in range(topics.partitions)]
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    echoed = 0
    try:
        while not stop.is_set():
            first = consumer.poll(0.5)
            if first is None:
                continue
            for msg in [first, *consumer.consume(PROCESSOR_BATCH - 1, 0)]:
                value = msg.value()
                if msg.error() is not None or value is None:
                    continue
                command_id = json.loads(value)["command_id"]
                reply = {"status": "accepted", "command_id": command_id, "event_ids": []}
                producer.produce(
                    topics.results, key=command_id.encode(), value=json.dumps(reply).encode()
                )
                producer.poll(0)
                echoed += 1
            producer.flush(30)
    finally:
        producer.flush(30)
        consumer.close()
        out.put(("echo", echoed))


class NoStoreBus:
    """Decodes nothing itself (the API does), routes the command and answers accepted; the
    engine is there for ``/health`` only."""

    def __init__(self, registry: Any, engine: Any) -> None:
        self.registry = registry
        self.store = SimpleNamespace(engine=engine)
        self.attempts = 0

    def send(self, command: Any, command_id: str | None = None) -> Accepted:
        route = self.registry.route(command)
        stream_type = getattr(route.aggregate_type, "stream_type", "aggregate")
        return Accepted(
            command_id or str(uuid.uuid4()), route.stream_id(command), stream_type, 0, (), None
        )


def run_no_store_api(settings: Settings, port: int) -> None:
    """Child process: the HTTP API under uvicorn as ``bench/load.py`` runs it, no store."""
    import uvicorn

    from connectors.postgres import make_engine
    from infra.commands import load_registry
    from infra.http_api import create_app

    registry, _module = load_registry(settings.command_handlers)
    bus: Any = NoStoreBus(registry, make_engine(settings.postgres()))
    app = create_app(settings, views=[], bus=bus)
    uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")).run()


@dataclass(frozen=True)
class Figures:
    """Round trips in a closed loop: how many, over how long, and latency percentiles (ms)."""

    count: int
    seconds: float
    p50: float
    p95: float
    produce_p50: float = 0.0  # topic: the send alone (produced, flushed)

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds else 0.0
