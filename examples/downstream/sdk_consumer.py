"""Read an events.* topic with Tributary's consumer SDK: typed events with their position."""

import os

from connectors.kafka import KafkaConfig
from connectors.subscriber import EventRecord, subscribe


def main() -> None:
    kafka = KafkaConfig(os.environ.get("BOOTSTRAP_SERVERS", "localhost:19092"))
    topic = os.environ.get("TOPIC", "events.post")
    left = int(os.environ.get("MAX_RECORDS", "-1"))  # -1: run forever
    with subscribe(
        [topic],
        os.environ.get("GROUP_ID", "my-team"),
        kafka=kafka,
        schema_registry_url=os.environ.get("SCHEMA_REGISTRY_URL", "http://localhost:18081"),
        properties={"session.timeout.ms": 10_000},
    ) as subscriber:
        for delivery in subscriber:  # asking for the next record commits this one
            event = delivery.value
            if isinstance(event, EventRecord):
                print(
                    delivery.position,
                    event.stream_id,
                    event.version,
                    event.event_type,
                    event.data,
                    flush=True,
                )
            left -= 1
            if left == 0:
                subscriber.commit()  # leaving the loop: commit the record in hand too
                break


if __name__ == "__main__":
    main()
