"""Benchmark: acknowledged produce requests a second on the local broker (not a test).

    .venv/bin/python bench/broker_produce.py [--seconds 8] [--threads 1,4,16] [--partitions 1,8]

Starts a local stack for each of the broker's storages (``memory``: the baseline, and ``s3``,
the object store `tributary up` uses by default), then for each number of partitions and of
producing threads: each thread has its own idempotent producer and sends single 300-byte
records, each flushed (what a command sender or a result writer does), for ``--seconds``.
Prints acknowledged records a second per case and, for ``s3``, the ratio to ``memory``'s same
case. Commands, their results and the events share this capacity on one local stack.
"""

import argparse
import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stopping import stop_cleanly_on_sigterm
from connectors.kafka import KafkaConfig, TopicAdmin
from connectors.kafka.producing import idempotent_producer
from connectors.kafka.topics import TopicSpec
from infra.stack import LocalStack
from infra.stack.isolated import isolated_settings

VALUE = b"x" * 300


def produce_rate(kafka: KafkaConfig, topic: str, threads: int, seconds: float) -> float:
    """Acknowledged records a second from ``threads`` producers, each record flushed."""
    counts = [0] * threads
    stop = time.monotonic() + seconds

    def run(k: int) -> None:
        producer = idempotent_producer(kafka)
        sent = 0
        while time.monotonic() < stop:
            producer.produce(topic, key=f"{k}-{sent}".encode(), value=VALUE)
            if producer.flush(30):
                raise RuntimeError(f"a record to {topic} was not acknowledged in 30 s")
            sent += 1
        counts[k] = sent

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    began = time.monotonic()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts) / (time.monotonic() - began)


def measure(
    storage: str, partitions: list[int], threads: list[int], seconds: float
) -> dict[tuple[int, int], float]:
    settings = isolated_settings("tributary-bench-produce-", broker_storage=storage)
    stack = LocalStack(settings)
    stack.up()
    try:
        kafka = settings.kafka("bench-produce")
        rates: dict[tuple[int, int], float] = {}
        for p in partitions:
            topic = f"bench-produce-{p}"
            TopicAdmin(kafka).ensure(TopicSpec(topic, partitions=p))
            for t in threads:
                rates[(p, t)] = produce_rate(kafka, topic, t, seconds)
                print(
                    f"  {storage}: {p} partition(s), {t} thread(s): {rates[(p, t)]:,.0f}/s",
                    flush=True,
                )
        return rates
    finally:
        stack.down()
        shutil.rmtree(settings.home.parent, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--threads", default="1,4,16")
    parser.add_argument("--partitions", default="1,8")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    partitions = [int(p) for p in args.partitions.split(",")]
    memory = measure("memory", partitions, threads, args.seconds)
    s3 = measure("s3", partitions, threads, args.seconds)
    print("\nacknowledged single-record produces a second (each flushed)")
    print(f"{'partitions':>10}{'threads':>8}{'memory':>10}{'s3':>10}{'s3/memory':>11}")
    for (p, t), base in memory.items():
        print(f"{p:>10}{t:>8}{base:>10,.0f}{s3[(p, t)]:>10,.0f}{s3[(p, t)] / base:>10.3f}x")


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
