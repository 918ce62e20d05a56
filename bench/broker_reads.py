"""Benchmark: what a view's read of a small range costs on the local broker (not a test).

    .venv/bin/python bench/broker_reads.py [--records 3000] [--read 10] [--rounds 7]

A view reads, each micro-batch, the few records that arrived since the last one. On the local
stack's broker (Tansu on an object store) that cost depends on how the partition was written.
This bench starts a local stack of its own and writes the same ``--records`` records (200-byte
values) to two one-partition topics:

- ``few batches``: produced at once (``linger.ms`` 50): a few large record batches, as a bulk
  import or a busy CDC stream writes them;
- ``one per record``: each record produced and flushed alone (one record batch each), as CDC
  writes a quiet table's changes, or the command processor its results.

Then, in interleaved rounds, it reads the last ``--read`` records of each with the views'
own range read (``spark_streaming.kafka_reader.read_range``: a new assigned consumer, as each
micro-batch's read task does), and prints the median time of each and the ratio of the
second to the first (the baseline). A produce-and-flush of one record is timed as well (the
broker's acknowledgement, on the second topic's writes).
"""

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rounds import Rounds
from bench.stopping import stop_cleanly_on_sigterm
from connectors.kafka.admin import TopicAdmin
from connectors.kafka.topics import TopicSpec
from infra.stack import LocalStack
from infra.stack.isolated import isolated_settings
from spark_streaming.kafka_offsets import OffsetRange
from spark_streaming.kafka_options import KafkaSourceOptions
from spark_streaming.kafka_reader import read_range

FEW, MANY = "bench-few-batches", "bench-one-batch-per-record"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--read", type=int, default=10, help="records per range read")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    settings = isolated_settings("tributary-broker-reads-")
    stack = LocalStack(settings)
    stack.up()
    try:
        kafka = settings.kafka("bench-broker-reads")
        admin = TopicAdmin(kafka)
        servers = kafka.bootstrap_servers
        acks: list[float] = []
        for topic, alone in ((FEW, False), (MANY, True)):
            admin.ensure(TopicSpec(topic, partitions=1))
            producer = Producer(
                {"bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 50}
            )
            for i in range(args.records):
                began = time.perf_counter()
                producer.produce(topic, key=str(i).encode(), value=b"x" * 200)
                if alone:
                    producer.flush(30)
                    acks.append(time.perf_counter() - began)
            producer.flush(30)
        options = KafkaSourceOptions.parse(
            {"kafka.bootstrap.servers": servers, "subscribe": f"{FEW},{MANY}"}
        )
        end = args.records

        def reading(topic: str) -> float:
            began = time.perf_counter()
            got = sum(
                batch.num_rows
                for batch in read_range(options, OffsetRange(topic, 0, end - args.read, end))
            )
            if got != args.read:
                raise RuntimeError(f"{topic}: read {got} records of {args.read}")
            return time.perf_counter() - began

        rounds = Rounds(
            {"few batches": lambda: reading(FEW), "one per record": lambda: reading(MANY)}
        )
        rounds.run(args.rounds)
        print(
            f"\nthe last {args.read} of {args.records} records of one partition,"
            " read as a view does:"
        )
        for label, values in rounds.samples.items():
            print(
                f"  {label:<16} median {statistics.median(values) * 1000:8.1f} ms"
                f"   ({min(values) * 1000:.1f} .. {max(values) * 1000:.1f})"
            )
        ratio, own = rounds.ratio("one per record", "few batches")
        print(
            f"  one per record / few batches: {ratio:.1f}x (median of the rounds' own: {own:.1f}x)"
        )
        print(
            f"produce + flush of one record: median {statistics.median(acks) * 1000:.1f} ms,"
            f" p99 {sorted(acks)[int(0.99 * (len(acks) - 1))] * 1000:.1f} ms"
        )
    finally:
        stack.down()
        shutil.rmtree(settings.home.parent, ignore_errors=True)


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
