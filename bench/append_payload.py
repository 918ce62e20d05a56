"""What the ``payload`` column costs an append: typed events with and without the payload head.

Run: ``flock /tmp/tributary-suite.lock .venv/bin/python bench/append_payload.py``. Uses
``TRIBUTARY_POSTGRES_URL`` when set, else starts a PostgreSQL of its own (as ``bench/append.py``).
Appends of 1 and of 1,000 ``PostCreated`` events, 3 s each, in 3 interleaved rounds; prints the
median events/s per case, then the codec's encode time with and without the head (the Avro
encoding of the event's fields). With a head, the store's trigger appends ``_meta`` in
PL/pgSQL. A measurement, not a test.
"""

import dataclasses
import statistics
import time
import uuid
from datetime import UTC, datetime

from sqlalchemy import create_engine

from bench.append import database
from connectors.schema_registry.memory import MemoryRegistry
from event_store import EventCodec, EventRegistry, EventStore, create_schema, drop_schema
from examples.social.posts import POST_EVENTS, PostCreated

SCHEMA = "bench_payload"


def main() -> None:
    with database() as url:
        engine = create_engine(url, pool_size=2)
        with engine.begin() as conn:
            create_schema(conn, SCHEMA)
        store = EventStore(engine, SCHEMA)
        codec = EventCodec(EventRegistry(POST_EVENTS))
        codec.register_schemas(MemoryRegistry())
        event = PostCreated(7, 3, "hello #kafka #cdc " * 5, ("kafka", "cdc"), datetime.now(UTC))
        typed = codec.encode(event, {"command_id": "c1"})
        plain = dataclasses.replace(typed, payload_head=None)
        results: dict[str, list[float]] = {}
        for _ in range(3):
            for name, proto in (("with payload", typed), ("without", plain)):
                for size in (1, 1000):
                    count, started = 0, time.perf_counter()
                    while time.perf_counter() - started < 3:
                        events = [
                            dataclasses.replace(proto, event_id=uuid.uuid4()) for _ in range(size)
                        ]
                        store.append(f"s-{uuid.uuid4()}", events, 0, stream_type="post")
                        count += size
                    rate = count / (time.perf_counter() - started)
                    results.setdefault(f"append {size} {name}", []).append(rate)
        for case, rates in sorted(results.items()):
            print(
                f"{case:24s} {statistics.median(rates):8.0f} events/s  {[round(r) for r in rates]}"
            )
        for label, used in (
            ("with head", codec),
            ("without", EventCodec(EventRegistry(POST_EVENTS))),
        ):
            started = time.perf_counter()
            for _ in range(20_000):
                used.encode(event, {"command_id": "c1"})
            print(f"codec.encode {label}: {(time.perf_counter() - started) / 20_000 * 1e6:.1f} us")
        with engine.begin() as conn:
            drop_schema(conn, SCHEMA)
        engine.dispose()


if __name__ == "__main__":
    main()
