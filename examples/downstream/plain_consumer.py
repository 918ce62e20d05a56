"""Read a cdc.* topic with the plain confluent-kafka client: key and value are JSON."""

import json
import os

from confluent_kafka import Consumer


def main() -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": os.environ.get("BOOTSTRAP_SERVERS", "localhost:19092"),
            "group.id": os.environ.get("GROUP_ID", "my-team"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,  # commit after handling: at-least-once
            "session.timeout.ms": 10_000,
        }
    )
    consumer.subscribe([os.environ.get("TOPIC", "cdc.public.users")])
    left = int(os.environ.get("MAX_RECORDS", "-1"))  # -1: run forever
    while left != 0:
        msg = consumer.poll(1.0)
        if msg is None or msg.error():
            continue
        key, value = json.loads(msg.key() or b"{}"), msg.value()
        if value is None:  # tombstone: the row is gone (compaction drops the key)
            print("tombstone", key, flush=True)
        else:
            change = json.loads(value)
            print(change["op"], key, change["after"], change["source"]["lsn"], flush=True)
        consumer.commit(message=msg, asynchronous=False)
        left -= 1
    consumer.close()


if __name__ == "__main__":
    main()
