"""Read a cdc.* or events.* topic with the plain confluent-kafka client: cdc.* values are JSON,
events.* values Avro in the Confluent wire format (the schema registry decodes them)."""

import json
import os

from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext


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
    registry = {"url": os.environ.get("SCHEMA_REGISTRY_URL", "http://localhost:18081")}
    avro = AvroDeserializer(SchemaRegistryClient(registry))
    consumer.subscribe([os.environ.get("TOPIC", "cdc.public.users")])
    left = int(os.environ.get("MAX_RECORDS", "-1"))  # -1: run forever
    while left != 0:
        msg = consumer.poll(1.0)
        if msg is None or msg.error():
            continue
        topic, key, value = msg.topic() or "", msg.key() or b"", msg.value()
        if topic.startswith("events."):  # key = stream id; a typed event, envelope in _meta
            event = avro(value, SerializationContext(topic, MessageField.VALUE))
            meta = event.pop("_meta")
            print(key.decode(), meta["version"], meta["event_type"], event, flush=True)
        elif value is None:  # tombstone: the row is gone (compaction drops the key)
            print("tombstone", json.loads(key), flush=True)
        else:
            change = json.loads(value)
            print(
                change["op"], json.loads(key), change["after"], change["source"]["lsn"], flush=True
            )
        consumer.commit(message=msg, asynchronous=False)
        left -= 1
    consumer.close()


if __name__ == "__main__":
    main()
