"""A real PostgreSQL source table whose changes are sent to Kafka in Debezium's wire format.

Stands in for the CDC connector: every insert, update and delete runs against the table, and
the matching record (key ``{"id": n}``, envelope with op/before/after/source.lsn, a tombstone
after each delete) is produced with an increasing LSN. ``version`` counts the changes of a row
since its insert, so a mirror's applied-count must equal it.
"""

import json
import random
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import psycopg

from connectors.kafka import KafkaConfig, TopicAdmin, state_topic
from connectors.kafka.producing import idempotent_producer

Record = tuple[bytes, bytes | None, list[tuple[str, bytes]]]


@dataclass
class ChangeFeed:
    """Runs random changes on ``schema.table`` and produces them to ``cdc.schema.table``."""

    dsn: str
    kafka: KafkaConfig
    schema: str
    table: str
    partitions: int = 2
    seed: int = 7
    lsn: int = 1_000_000
    sent: list[Record] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.topic = f"cdc.{self.schema}.{self.table}"
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.conn.execute(
            f"CREATE TABLE {self.qualified} (id int PRIMARY KEY, name text NOT NULL,"
            " qty int NOT NULL, active boolean NOT NULL, version int NOT NULL)"
        )
        TopicAdmin(self.kafka).ensure(state_topic(self.topic, self.partitions))
        self.producer = idempotent_producer(self.kafka, {"linger.ms": 20})
        self.next_id = 1

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    def ids(self) -> list[int]:
        return [r[0] for r in self.conn.execute(f"SELECT id FROM {self.qualified}").fetchall()]

    def run(self, changes: int, delete_share: float = 0.2, insert_share: float = 0.35) -> None:
        """``changes`` random inserts, updates and deletes, each sent as Debezium would."""
        live = self.ids()
        for _ in range(changes):
            roll = self.rng.random()
            if not live or roll < insert_share:
                live.append(self.insert())
            elif roll < insert_share + delete_share:
                self.delete(live.pop(self.rng.randrange(len(live))))
            else:
                self.update(self.rng.choice(live))
        self.flush()

    def insert(self, row_id: int | None = None) -> int:
        if row_id is None:
            row_id, self.next_id = self.next_id, self.next_id + 1
        row = self._one(
            f"INSERT INTO {self.qualified} VALUES (%s, %s, %s, %s, 1) RETURNING *",
            (row_id, f"name-{self.rng.randrange(10**6)}", self.rng.randrange(1000), True),
        )
        self._send("c", None, row)
        return row_id

    def update(self, row_id: int) -> None:
        before = self._one(f"SELECT * FROM {self.qualified} WHERE id = %s", (row_id,))
        after = self._one(
            f"UPDATE {self.qualified} SET name = %s, qty = %s, active = %s,"
            " version = version + 1 WHERE id = %s RETURNING *",
            (
                f"name-{self.rng.randrange(10**6)}",
                self.rng.randrange(1000),
                self.rng.random() < 0.5,
                row_id,
            ),
        )
        self._send("u", before, after)

    def delete(self, row_id: int) -> None:
        before = self._one(f"DELETE FROM {self.qualified} WHERE id = %s RETURNING *", (row_id,))
        lsn, tx = self._send("d", before, None)
        key = json.dumps({"id": row_id}).encode()
        self._produce(key, None, [("lsn", str(lsn).encode()), ("txId", str(tx).encode())])

    def _one(self, query: str, params: tuple[Any, ...]) -> dict[str, Any]:
        cur = self.conn.execute(query, params)  # type: ignore[arg-type]
        names = [d.name for d in cur.description or ()]
        values = cur.fetchone()
        assert values is not None
        return dict(zip(names, values, strict=True))

    def _send(
        self, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None
    ) -> tuple[int, int]:
        self.lsn += self.rng.randrange(8, 200)
        tx = self.lsn // 3
        now = int(time.time() * 1000)
        row = after or before
        assert row is not None
        envelope = {
            "before": before,
            "after": after,
            "source": {
                "version": "3.6.3.Final",
                "connector": "postgresql",
                "name": "cdc",
                "ts_ms": now,
                "snapshot": "false",
                "db": "tributary",
                "schema": self.schema,
                "table": self.table,
                "txId": tx,
                "lsn": self.lsn,
            },
            "op": op,
            "ts_ms": now,
        }
        key = json.dumps({"id": row["id"]}).encode()
        self._produce(key, json.dumps(envelope).encode(), [])
        return self.lsn, tx

    def _produce(self, key: bytes, value: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        self.sent.append((key, value, headers))
        self.producer.produce(self.topic, key=key, value=value, headers=headers)
        self.producer.poll(0)

    def resend(self, records: list[Record]) -> None:
        """Produce already-sent records again (a duplicate delivery from upstream)."""
        for key, value, headers in records:
            self.producer.produce(self.topic, key=key, value=value, headers=headers)
        self.flush()

    def produce_raw(self, key: bytes | None, value: bytes | None) -> None:
        self.producer.produce(self.topic, key=key, value=value)
        self.flush()

    def flush(self) -> None:
        assert self.producer.flush(30) == 0

    def rows(self) -> dict[int, tuple[Any, ...]]:
        """The source table: id -> (name, qty, active, version)."""
        return {
            r[0]: tuple(r[1:])
            for r in self.conn.execute(
                f"SELECT id, name, qty, active, version FROM {self.qualified}"
            ).fetchall()
        }

    def close(self) -> None:
        self.producer.flush(10)
        self.conn.execute(f"DROP TABLE IF EXISTS {self.qualified}")
        self.conn.close()


def mirror_rows(dsn: str, qualified: str) -> dict[int, tuple[Any, ...]]:
    """The mirror: id -> (name, qty, active, version); numbers come back as ints."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT id, name, qty, active, version FROM {qualified}").fetchall()
    return {int(r[0]): tuple(_plain(v) for v in r[1:]) for r in rows}


def applied_counts(dsn: str, qualified: str) -> dict[int, int]:
    """id -> how many changes the mirror applied to the row since its insert."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT id, _applied_count FROM {qualified}").fetchall()
    return {int(r[0]): int(r[1]) for r in rows}


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value
