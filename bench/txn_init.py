"""Benchmark: how long a partition's results producer takes to get ready on the local broker
(not a test): where the second that ``TRIBUTARY_COMMAND_RESULTS_EXACTLY_ONCE`` adds to a
take-over goes.

    .venv/bin/python bench/txn_init.py [--rounds 20]

Starts a local stack of its own (the broker alone), then, in interleaved rounds, times:

- ``idempotent``: a new idempotent producer's first record, sent and acknowledged (it asks the
  broker for a producer id too): the baseline;
- ``txn fresh``: a new transactional producer's ``init_transactions`` with a new
  ``transactional.id``;
- ``txn after metadata``: the same after a metadata request (a broker connection up first);
- ``txn after kill -9``: ``init_transactions`` of a ``transactional.id`` whose previous producer
  was killed (``kill -9``) inside an open transaction: a take-over's case, fencing it.

Prints each case's median, how many rounds took over 0.4 s, and the ratio of the medians to
the baseline's. librdkafka retries the producer-id request on a fixed 500 ms timer when the
transaction coordinator's connection is not up yet (``rd_kafka_idemp_pid_timer_restart`` in
``rdkafka_idempotence.c``): a new owner initialises one producer per partition side by side
and waits for the slowest.
"""

import argparse
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Producer

from bench.rounds import Rounds
from bench.stopping import stop_cleanly_on_sigterm
from connectors.kafka import KafkaConfig, TopicAdmin
from connectors.kafka.topics import TopicSpec
from infra.stack import LocalStack
from infra.stack.isolated import isolated_settings

TOPIC = "txn-init"
SLOW_S = 0.4

# A producer in an open transaction, killed -9 by the bench once it says "ready".
OPEN_TRANSACTION = """
import sys, time
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[2]})
p.init_transactions(30)
p.begin_transaction()
for _ in range(10):
    p.produce(sys.argv[3], b"x", partition=0)
p.flush(10)
print("ready", flush=True)
time.sleep(120)
"""


def cases(servers: str) -> dict[str, Callable[[], float]]:
    def transactional(tid: str) -> Producer:
        return Producer({"bootstrap.servers": servers, "transactional.id": tid})

    def idempotent() -> float:
        p = Producer({"bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 0})
        started = time.monotonic()
        p.produce(TOPIC, b"x", partition=0)
        assert p.flush(30) == 0
        return time.monotonic() - started

    def fresh() -> float:
        p = transactional(f"fresh-{uuid.uuid4()}")
        started = time.monotonic()
        p.init_transactions(30)
        return time.monotonic() - started

    def after_metadata() -> float:
        p = transactional(f"meta-{uuid.uuid4()}")
        started = time.monotonic()
        p.list_topics(TOPIC, timeout=15)
        p.init_transactions(30)
        return time.monotonic() - started

    def after_kill() -> float:
        tid = f"killed-{uuid.uuid4()}"
        child = subprocess.Popen(
            [sys.executable, "-c", OPEN_TRANSACTION, servers, tid, TOPIC],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        finally:
            child.kill()
            child.wait()
        p = transactional(tid)
        started = time.monotonic()
        p.init_transactions(30)
        return time.monotonic() - started

    return {
        "idempotent": idempotent,
        "txn fresh": fresh,
        "txn after metadata": after_metadata,
        "txn after kill -9": after_kill,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    settings = isolated_settings("tributary-bench-txn-")
    stack = LocalStack(settings)
    try:
        stack.up([stack.broker.name])
        servers = stack.broker.endpoint()
        TopicAdmin(KafkaConfig(servers)).ensure(TopicSpec(TOPIC, partitions=4))
        rounds = Rounds(cases(servers)).run(args.rounds)
        base = rounds.median("idempotent")
        print(f"{'case':<20} {'median':>9} {'over 0.4 s':>11} {'x baseline':>11}")
        for label, values in rounds.samples.items():
            median = rounds.median(label)
            slow = sum(v > SLOW_S for v in values)
            print(
                f"{label:<20} {median * 1000:>6.0f} ms {slow:>4} of {len(values):<4}"
                f" {median / base:>10.1f}x"
            )
    finally:
        stack.down(purge=True)
        shutil.rmtree(settings.home.parent, ignore_errors=True)


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
