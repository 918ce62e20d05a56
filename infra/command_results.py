"""Reading ``command-results`` by command id: the answers the command processor gives, for
the chaos harness's workload (``tests/chaos``) and the load benchmark (``bench/load.py``)."""

import json
import threading
import uuid
from collections import defaultdict
from typing import Any

from confluent_kafka import TopicPartition

from connectors.kafka.following import Follower
from infra.commands import command_topics
from infra.settings import Settings

__all__ = ["Results"]


#: librdkafka's ``fetch.wait.max.ms`` default, the reader's first wait when none is given
DEFAULT_FETCH_WAIT_MS = 500


class Results(threading.Thread):
    """Every record of ``command-results`` by command id, read from offset 0 (again from the
    start if the broker lost records and the position falls beyond the end). Its fetch wait
    lengthens when a short one stops bringing records (see ``connectors.kafka.following``)."""

    def __init__(
        self, s: Settings, client: str = "chaos-results", fetch_wait_ms: int | None = None
    ) -> None:
        """``fetch_wait_ms``: the consumer's first ``fetch.wait.max.ms`` (librdkafka's
        default, 500 ms, when None)."""
        super().__init__(name="results", daemon=True)
        self.by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.cond = threading.Condition()
        self.halt = threading.Event()
        topics = command_topics(s)
        props: dict[str, str | int] = {
            "group.id": f"{client}-{uuid.uuid4()}",
            "enable.auto.commit": "false",
            "auto.offset.reset": "earliest",
        }
        wait_ms = DEFAULT_FETCH_WAIT_MS if fetch_wait_ms is None else fetch_wait_ms
        self._consumer = Follower(s.kafka(client), props, wait_ms, f"results reader {client}")
        self._consumer.assign(
            [TopicPartition(topics.results, p, 0) for p in range(topics.partitions)]
        )

    def run(self) -> None:
        while not self.halt.is_set():
            # A short batch wait: a sender waits for its answer (load measures that latency).
            for msg in self._consumer.take(500, 0.05):
                key, value = msg.key(), msg.value()
                if msg.error() is None and key is not None and value is not None:
                    with self.cond:
                        self.by_id[key.decode()].append(json.loads(value))
                        self.cond.notify_all()
        self._consumer.close()

    def wait(self, command_id: str, timeout: float) -> dict[str, Any] | None:
        with self.cond:
            self.cond.wait_for(lambda: command_id in self.by_id, timeout)
            found = self.by_id.get(command_id)
            return found[0] if found else None

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        with self.cond:
            return {k: list(v) for k, v in self.by_id.items()}
