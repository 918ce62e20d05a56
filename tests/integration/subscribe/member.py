"""A group member in its own process (so a test can ``kill -9`` it): prints its assignment
(``A topic:partition ...``) when it changes and each record it handles (``R partition offset
stream_id version``), then sleeps ``delay`` seconds per record (a slow handler).

    python -m tests.integration.subscribe.member BOOTSTRAP TOPIC GROUP DELAY REGISTRY
"""

import sys
import time

from connectors.kafka import KafkaConfig
from connectors.subscriber import subscribe
from tests.integration.subscribe.conftest import GROUP_PROPERTIES


def main(bootstrap: str, topic: str, group: str, delay: float, registry: str) -> None:
    kafka = KafkaConfig(bootstrap, client_id="member")
    shown: list[tuple[str, int]] = []
    with subscribe(
        [topic],
        group,
        kafka=kafka,
        commit_interval=0.2,
        properties=GROUP_PROPERTIES,
        schema_registry_url=registry,
    ) as subscriber:
        while True:
            delivery = subscriber.poll(0.2)
            if subscriber.assignment() != shown:
                shown = subscriber.assignment()
                say("A", *(f"{t}:{p}" for t, p in shown))
            if delivery is None:
                continue
            event = delivery.value
            stream = getattr(event, "stream_id", "-")
            version = getattr(event, "version", 0)
            pos = delivery.position
            say("R", pos.partition, pos.offset, stream, version)
            time.sleep(delay)


def say(*fields: object) -> None:
    """One line in one write: where PYTHONUNBUFFERED is set, ``print`` writes each field and
    separator on its own, and a kill -9 between two of them left half a line (say ``R 3 41``)."""
    sys.stdout.write(" ".join(map(str, fields)) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5])
