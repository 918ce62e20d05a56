"""Benchmark: the view stores' batch apply, against plain bulk writes of the same rows (not a test).

    .venv/bin/python bench/stores.py [--rows 200000] [--batch 50000] [--mat-rows 20000]
        [--stores postgres,postgres-typed,redis,tantivy,kafka] [--memory-keys 100000,1000000]

Starts its own local stack (PostgreSQL, SeaweedFS + Tansu, Redis) on free ports and a tantivy
folder, builds ``--rows`` writes of one collection (keys ``e<i>``, about 150 bytes of JSON
fields each) as the write table a view job hands a store, and measures in the same run, per
store:

  insert    ``writer.apply`` of the rows in batches of ``--batch`` (new keys)
  update    the same keys again at higher positions (every write passes the guard)
  stale     the update batches sent again under new offsets (every write is dropped by the
            position guard)
  plain     the baseline: a plain bulk write of the same rows - PostgreSQL: one COPY into a
            plain table (primary key on the key); Redis: pipelined HSET of the same hashes;
            Kafka: an idempotent producer's produce + flush of the same records; tantivy:
            ``add_document`` of the same documents + one commit

and prints rows/s and the ratio to the plain write. ``--mat-rows`` rows go through each store
again with a materializer (a counter per group: ``get`` + ``put`` per touched group, and the
writes' ``before``). Then the Kafka writer's memory: ``--memory-keys`` keys are written to a
Kafka store, and a new writer rebuilds its state from the topic (Python heap by tracemalloc,
Arrow's pool, and the process's RSS; current after the rebuild and the peak during it).

The stores are given the batch as the Arrow write table when they take one
(``tributary.view_model.write_table`` exists), else as Put objects (converted before the
clock starts), so the same command measures the code before and after the columnar path.
"""

import argparse
import gc
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import redis
import tantivy
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stopping import stop_cleanly_on_sigterm
from connectors.kafka import KafkaConfig
from connectors.stores.kafka import KafkaStore
from connectors.stores.pg_tables import TypedColumn, TypedTable
from connectors.stores.postgres import PostgresStore
from connectors.stores.redis import RedisStore, render
from connectors.stores.tantivy import SearchField, TantivyStore
from infra.settings import Settings, load_settings
from infra.stack import LocalStack
from infra.stack.isolated import free_port_block
from tributary import view_model as model
from tributary.view_model import Applied, Batch, Delete, JsonObject, Put, SourceRef
from tributary.view_store import Collection, Materializer, StoreTxn, ViewStore

STORES = ("postgres", "postgres-typed", "redis", "tantivy", "kafka")
STACK_PORTS = 12  # postgres, redis, broker, s3, 7 internal object-store ports, registry
TOPIC = "bench.source"
COLLECTION = "items"
GROUPS = "groups"
COLUMNS = (
    TypedColumn("id", "bigint"),
    TypedColumn("user_id", "bigint"),
    TypedColumn("kind", "text"),
    TypedColumn("query", "text"),
    TypedColumn("ts", "bigint"),
    TypedColumn("group", "text"),
)


# -- the stack (its own folder and ports, as bench/analytics.py starts it) -------------------


def bench_settings() -> Settings:
    home = Path(tempfile.mkdtemp(prefix="tributary-bench-stores-"))
    os.chmod(home, 0o755)  # PostgreSQL runs as the postgres OS user under root
    base = free_port_block(STACK_PORTS)
    return load_settings(
        home=home / "state",
        postgres_port=base,
        redis_port=base + 1,
        broker_port=base + 2,
        objectstore_port=base + 3,
        objectstore_internal_port=base + 4,
        schema_registry_port=base + 11,
        kafka_bootstrap_servers=None,
        postgres_url=None,
        redis_url=None,
        schema_registry_url=None,
    )


# -- the workload -----------------------------------------------------------------------------


def fields_of(i: int, round_: int, typed: bool) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "user_id": i % 5000,
        "kind": "click" if i % 3 else "search",
        "query": f"word{i % 300} term{i % 77} round{round_}",
        "ts": 1_700_000_000_000 + i * 37 + round_,
        "group": f"g{(i + round_) % 1000}",
    }
    if typed:
        fields = {"id": i, **fields}
    return fields


def key_of(i: int, typed: bool) -> str:
    return json.dumps({"id": i}, separators=(",", ":")) if typed else f"e{i}"


def write_rows(first: int, count: int, round_: int, typed: bool) -> pa.Table:
    """``count`` Puts as the write table (positions grow with the round)."""
    ids = range(first, first + count)
    n = len(ids)
    texts = [json.dumps(fields_of(i, round_, typed), separators=(",", ":")) for i in ids]
    return pa.table(
        {
            "collection": pa.array([COLLECTION] * n, pa.string()),
            "key": pa.array([key_of(i, typed) for i in ids], pa.string()),
            "position": pa.array([round_ * 10_000_000 + i + 1 for i in ids], pa.int64()),
            "deleted": pa.array([False] * n, pa.bool_()),
            "fields": pa.array(texts, pa.string()),
            "member": pa.array([None] * n, pa.string()),
            "changes": pa.array([None] * n, pa.list_(pa.int64())),
            "fresh": pa.array([round_ == 0] * n, pa.bool_()),
            "topic": pa.array([TOPIC] * n, pa.string()),
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(list(ids), pa.int64()),
        }
    )


def as_objects(table: pa.Table) -> list[Put | Delete]:
    """The write table as Put/Delete objects (what stores without the columnar path take)."""
    out: list[Put | Delete] = []
    for row in table.to_pylist():
        source = SourceRef(row["topic"], row["partition"], row["offset"])
        if row["deleted"]:
            out.append(Delete(row["collection"], row["key"], row["position"], source))
        else:
            out.append(
                Put(
                    row["collection"],
                    row["key"],
                    row["position"],
                    JsonObject(row["fields"], row["member"]),
                    tuple(row["changes"] or ()),
                    row["fresh"],
                    source,
                )
            )
    return out


COLUMNAR = hasattr(model, "write_table")


def feed(table: pa.Table) -> Any:
    return table if COLUMNAR else as_objects(table)


def count_groups(txn: StoreTxn, applied: Sequence[Applied]) -> None:
    """A counter per group: ``before`` of every applied write, ``get`` + ``put`` per group."""
    delta: Counter[str] = Counter()
    for change in applied:
        if change.write.collection != COLLECTION:
            continue
        if change.before is not None and change.before.get("group") is not None:
            delta[str(change.before["group"])] -= 1
        if isinstance(change.write, Put):
            delta[str(change.write.fields["group"])] += 1
    for group, d in sorted(delta.items()):
        if d == 0:
            continue
        entry = txn.get(GROUPS, group)
        count = (0 if entry is None else int(entry.fields["count"])) + d
        if count:
            txn.put(GROUPS, group, {"count": count})
        else:
            txn.delete(GROUPS, group)


# -- the stores ---------------------------------------------------------------------------


class Env:
    def __init__(self, settings: Settings, work: Path) -> None:
        self.settings = settings
        self.dsn = settings.postgres().dsn
        self.redis_url = settings.cache_url
        self.kafka: KafkaConfig = settings.kafka("bench-stores")
        self.work = work


def build(env: Env, kind: str, view: str, materializer: Materializer | None) -> ViewStore:
    collections = [Collection(COLLECTION), Collection(GROUPS)]
    if kind == "postgres":
        return PostgresStore(env.dsn, "bench", view, collections, materializer)
    if kind == "postgres-typed":
        table = TypedTable(COLLECTION, f"typed_{view.replace('-', '_')}", COLUMNS, ("id",))
        return PostgresStore(env.dsn, "bench", view, [table, Collection(GROUPS)], materializer)
    if kind == "redis":
        return RedisStore(env.redis_url, view, collections, materializer)
    if kind == "tantivy":
        return TantivyStore(
            env.work / "tantivy", view, collections, materializer, (SearchField("query"),)
        )
    if kind == "kafka":
        return KafkaStore(env.kafka, view, collections, materializer)
    raise ValueError(kind)


def apply_rounds(
    store: ViewStore, rows: int, batch: int, typed: bool
) -> tuple[float, float, float]:
    """Seconds of writer.apply for the insert, update and stale passes."""
    writer = store.writer(store.live_generation(), live=True)
    # Warm: tables and topics created, clients connected, before the clock starts.
    assert writer.apply(Batch(0, {TOPIC: {"0": 1}}, feed(write_rows(rows, 1, 0, typed))))
    batch_id, offset = 1, 1
    seconds = []
    for round_ in (0, 1, 1):  # inserts, updates, the updates again (stale)
        spent = 0.0
        for first in range(0, rows, batch):
            writes = feed(write_rows(first, min(batch, rows - first), round_, typed))
            offset += 1
            gc.collect()
            began = time.perf_counter()
            assert writer.apply(Batch(batch_id, {TOPIC: {"0": offset}}, writes))
            spent += time.perf_counter() - began
            batch_id += 1
            del writes
        seconds.append(spent)
    writer.close()
    return seconds[0], seconds[1], seconds[2]


# -- the baselines -----------------------------------------------------------------------------


def plain_postgres(env: Env, rows: int, batch: int, typed: bool) -> float:
    import pyarrow.csv as pcsv

    table = f"plain_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(env.dsn, autocommit=True) as conn:
        if typed:
            conn.execute(
                f"CREATE TABLE bench.{table} (id bigint PRIMARY KEY, user_id bigint, kind text,"
                ' query text, ts bigint, "group" text, _position bigint, _applied_count bigint)'
            )
        else:
            conn.execute(
                f"CREATE TABLE bench.{table} (key text PRIMARY KEY, _position bigint,"
                " _applied_count bigint, fields jsonb)"
            )
        spent = 0.0
        for first in range(0, rows, batch):
            writes = write_rows(first, min(batch, rows - first), 0, typed)
            if typed:
                data = pa.Table.from_pylist([json.loads(t) for t in writes["fields"].to_pylist()])
                data = data.append_column("_position", writes["position"])
                data = data.append_column("_applied_count", pa.array([1] * len(data), pa.int64()))
                columns = 'id, user_id, kind, query, ts, "group", _position, _applied_count'
            else:
                data = pa.table(
                    {
                        "key": writes["key"],
                        "_position": writes["position"],
                        "_applied_count": pa.array([1] * len(writes), pa.int64()),
                        "fields": writes["fields"],
                    }
                )
                columns = "key, _position, _applied_count, fields"
            sink = pa.BufferOutputStream()
            gc.collect()
            began = time.perf_counter()
            pcsv.write_csv(data, sink, pcsv.WriteOptions(include_header=False))
            with conn.transaction(), conn.cursor() as cur:
                statement = f"COPY bench.{table} ({columns}) FROM STDIN (FORMAT csv)"
                with cur.copy(statement) as copy:
                    copy.write(sink.getvalue().to_pybytes())
            spent += time.perf_counter() - began
        conn.execute(f"DROP TABLE bench.{table}")
    return spent


def plain_redis(env: Env, rows: int, batch: int) -> float:
    client = redis.Redis.from_url(env.redis_url, decode_responses=True)
    client.ping()
    prefix = f"plain:{uuid.uuid4().hex[:8]}:"
    spent = 0.0
    for first in range(0, rows, batch):
        writes = write_rows(first, min(batch, rows - first), 0, False)
        hashes = []
        for key, position, text in zip(
            writes["key"].to_pylist(),
            writes["position"].to_pylist(),
            writes["fields"].to_pylist(),
            strict=True,
        ):
            mapping: dict[str, Any] = {}
            for name, value in json.loads(text).items():
                shown = render(value)
                if shown is not None:
                    mapping[name] = shown
            mapping.update({"_position": position, "_applied": 1, "_json": text})
            hashes.append((prefix + key, mapping))
        gc.collect()
        began = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        for name, mapping in hashes:
            pipe.hset(name, mapping=mapping)
        pipe.execute()
        spent += time.perf_counter() - began
    for name in client.scan_iter(match=prefix + "*", count=10_000):
        client.delete(name)
    client.close()
    return spent


def _acknowledged(offsets: list[int]) -> Any:
    def done(err: Any, msg: Any) -> None:
        offsets.append(msg.offset())

    return done


def plain_kafka(env: Env, rows: int, batch: int) -> float:
    from connectors.kafka import TopicAdmin, history_topic

    topic = f"bench.plain.{uuid.uuid4().hex[:8]}"
    TopicAdmin(env.kafka).ensure(history_topic(topic, 1))
    producer = Producer(
        env.kafka.client_properties(**{"enable.idempotence": True, "acks": "all", "linger.ms": 5})
    )
    spent = 0.0
    for first in range(0, rows, batch):
        writes = write_rows(first, min(batch, rows - first), 0, False)
        records = [
            (
                key.encode(),
                text.encode(),
                [
                    ("tributary.position", str(position).encode()),
                    ("tributary.applied", b"1"),
                    ("tributary.generation", b"g0"),
                    ("tributary.batch", b"0"),
                ],
            )
            for key, position, text in zip(
                writes["key"].to_pylist(),
                writes["position"].to_pylist(),
                writes["fields"].to_pylist(),
                strict=True,
            )
        ]
        offsets: list[int] = []
        done = _acknowledged(offsets)

        gc.collect()
        began = time.perf_counter()
        for key, value, headers in records:
            while True:
                try:
                    producer.produce(topic, key=key, value=value, headers=headers, on_delivery=done)
                    break
                except BufferError:
                    producer.poll(0.05)
        assert producer.flush(60) == 0
        spent += time.perf_counter() - began
        assert len(offsets) == len(records)
    TopicAdmin(env.kafka).delete(topic)
    return spent


def plain_tantivy(env: Env, rows: int, batch: int) -> float:
    builder = tantivy.SchemaBuilder()
    for name in ("_uid", "_collection", "_kind", "_key"):
        builder.add_text_field(name, stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_integer_field("_position", stored=True, indexed=True)
    builder.add_integer_field("_applied", stored=True)
    builder.add_bytes_field("_fields", stored=True, indexed=False)
    builder.add_text_field("query", stored=True, tokenizer_name="en_stem")
    schema = builder.build()
    folder = env.work / f"plain-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    index = tantivy.Index(schema, path=str(folder))
    writer = index.writer(heap_size=64_000_000, num_threads=1)
    spent = 0.0
    for first in range(0, rows, batch):
        writes = write_rows(first, min(batch, rows - first), 0, False)
        docs = [
            {
                "_uid": "entry\x1fitems\x1f" + key,
                "_collection": COLLECTION,
                "_kind": "entry",
                "_key": key,
                "_position": position,
                "_applied": 1,
                "_fields": text.encode(),
                "query": json.loads(text)["query"],
            }
            for key, position, text in zip(
                writes["key"].to_pylist(),
                writes["position"].to_pylist(),
                writes["fields"].to_pylist(),
                strict=True,
            )
        ]
        gc.collect()
        began = time.perf_counter()
        for doc in docs:
            writer.add_document(tantivy.Document.from_dict(doc, schema))
        writer.commit()
        spent += time.perf_counter() - began
    writer.wait_merging_threads()
    shutil.rmtree(folder, ignore_errors=True)
    return spent


def plain(env: Env, kind: str, rows: int, batch: int) -> float:
    if kind.startswith("postgres"):
        return plain_postgres(env, rows, batch, kind == "postgres-typed")
    if kind == "redis":
        return plain_redis(env, rows, batch)
    if kind == "kafka":
        return plain_kafka(env, rows, batch)
    return plain_tantivy(env, rows, batch)


# -- memory of the Kafka writer --------------------------------------------------------------


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def kafka_memory(env: Env, keys: int, batch: int) -> dict[str, float]:
    """Fill a Kafka store with ``keys`` keys, then rebuild a new writer's state from the topic."""
    view = f"mem-{uuid.uuid4().hex[:8]}"
    store = build(env, "kafka", view, None)
    gen = store.live_generation()
    writer = store.writer(gen, live=True)
    began = time.perf_counter()
    end = 0
    for first in range(0, keys, batch):
        end += 1
        writer.apply(
            Batch(
                end - 1,
                {TOPIC: {"0": end}},
                feed(write_rows(first, min(batch, keys - first), 0, False)),
            )
        )
    fill_s = time.perf_counter() - began
    writer.close()
    del writer
    store.close()
    gc.collect()
    began = time.perf_counter()  # the rebuild's time, without tracemalloc slowing it
    timed = build(env, "kafka", view, None)
    timed_writer = timed.writer(gen, live=True)
    timed_writer.apply(Batch(end, {TOPIC: {"0": end + 1}}, feed(write_rows(0, 0, 0, False))))
    rebuild_s = time.perf_counter() - began
    timed_writer.close()
    timed.close()
    del timed_writer, timed
    gc.collect()
    fresh = build(env, "kafka", view, None)
    before_rss = rss_mb()
    arrow_before = pa.total_allocated_bytes()
    tracemalloc.start()
    began = time.perf_counter()
    rebuilt = fresh.writer(gen, live=True)
    rebuilt.apply(Batch(end + 1, {TOPIC: {"0": end + 2}}, feed(write_rows(0, 0, 0, False))))
    traced_s = time.perf_counter() - began
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out = {
        "fill_s": fill_s,
        "rebuild_s": rebuild_s,
        "traced_s": traced_s,
        "heap_mb": current / 2**20,
        "heap_peak_mb": peak / 2**20,
        "arrow_mb": (pa.total_allocated_bytes() - arrow_before) / 2**20,
        "rss_mb": rss_mb() - before_rss,
    }
    rebuilt.close()
    del rebuilt
    fresh.close()
    gc.collect()
    return out


# -- the staging format of the PostgreSQL store: CSV (what it uses) against COPY binary --------

_PGCOPY = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # signature, flags, header extension length


def _be32(out: np.ndarray, at: np.ndarray, values: Any) -> None:
    v = np.asarray(values).astype(np.int64).astype(np.uint32)
    for i in range(4):
        out[at + i] = ((v >> np.uint32(24 - 8 * i)) & np.uint32(0xFF)).astype(np.uint8)


def _be64(out: np.ndarray, at: np.ndarray, values: Any) -> None:
    v = np.asarray(values).astype(np.uint64)
    for i in range(8):
        out[at + i] = ((v >> np.uint64(56 - 8 * i)) & np.uint64(0xFF)).astype(np.uint8)


def _text(column: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    array = column.combine_chunks().cast(pa.large_binary())
    n = len(array)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset : array.offset + n + 1]
    data = np.frombuffer(array.buffers()[2] or b"\0", dtype=np.uint8)
    valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return offsets, data, valid


def copy_binary(table: pa.Table, columns: Any) -> bytes:
    """The staging rows in COPY's binary format, built column-wise with numpy (text, text,
    jsonb, text, int8, int8[], bool, bool)."""
    n = columns.n
    texts = [_text(table[name]) for name in ("collection", "key", "fields", "member")]
    lengths = [np.where(valid, np.diff(offsets), 0) for offsets, _, valid in texts]
    extra = [0, 0, 1, 0]  # jsonb's version byte
    sizes = [4 + np.where(texts[i][2], lengths[i] + extra[i], 0) for i in range(4)]
    counts = np.diff(columns.change_offsets)
    sizes += [np.full(n, 12), 4 + 20 + 12 * counts, np.full(n, 5), np.full(n, 5)]
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(2 + sum(sizes), out=starts[1:])
    starts += len(_PGCOPY)
    out = np.zeros(int(starts[-1]) + 2, dtype=np.uint8)
    out[: len(_PGCOPY)] = np.frombuffer(_PGCOPY, np.uint8)
    out[-2:] = 0xFF  # the trailer: -1 fields
    out[starts[:-1] + 1] = 8  # fields per row
    at = starts[:-1] + 2
    for i, (offsets, data, valid) in enumerate(texts):
        _be32(out, at, np.where(valid, lengths[i] + extra[i], -1))
        body = at + 4
        if extra[i]:
            out[body[valid]] = 1
            body = body + 1
        size = lengths[i]
        total = int(size.sum())
        if total:
            before = np.concatenate([[0], np.cumsum(size)[:-1]])
            source = np.arange(total) + np.repeat(offsets[:-1] - before, size)
            target = np.arange(total) + np.repeat(body - before, size)
            out[target] = data[source]
        at = at + sizes[i]
    _be32(out, at, np.full(n, 8))
    _be64(out, at + 4, columns.position)
    at = at + 12
    _be32(out, at, 20 + 12 * counts)
    _be32(out, at + 4, np.ones(n))  # dimensions
    _be32(out, at + 8, np.zeros(n))  # no nulls
    _be32(out, at + 12, np.full(n, 20))  # int8's type oid
    _be32(out, at + 16, counts)
    _be32(out, at + 20, np.ones(n))  # lower bound
    m = len(columns.change_values)
    element = np.repeat(at + 24, counts) + 12 * (
        np.arange(m) - np.repeat(columns.change_offsets[:-1], counts)
    )
    _be32(out, element, np.full(m, 8))
    _be64(out, element + 4, columns.change_values)
    at = at + 24 + 12 * counts
    _be32(out, at, np.ones(n))
    out[at + 4] = columns.fresh
    at = at + 5
    _be32(out, at, np.ones(n))
    out[at + 4] = columns.deleted
    return bytes(out.tobytes())


def staging_formats(env: Env, rows: int) -> dict[str, float]:
    """Seconds to build and COPY the same rows into the store's staging table as CSV (Arrow's
    writer) and as COPY binary (built column-wise with numpy); the two tables must agree."""
    from connectors.stores.postgres import csv_bytes, stage_table
    from connectors.stores.writes import WriteColumns

    table = write_rows(0, rows, 1, False)
    columns = WriteColumns(table)
    out: dict[str, float] = {}
    digests = []
    with psycopg.connect(env.dsn, autocommit=True) as conn:
        for name in ("csv", "binary"):
            conn.execute(
                f"CREATE TEMP TABLE stage_{name} (coll text, k text, r jsonb, m text, pos bigint,"
                " changes bigint[], fresh boolean, deleted boolean)"
            )
            gc.collect()
            began = time.perf_counter()
            if name == "csv":
                data = csv_bytes(stage_table(columns))
                statement = f"COPY stage_{name} FROM STDIN (FORMAT csv)"
            else:
                data = copy_binary(table, columns)
                statement = f"COPY stage_{name} FROM STDIN (FORMAT binary)"
            built = time.perf_counter()
            with conn.cursor() as cur, cur.copy(statement) as copy:
                copy.write(data)
            out[f"{name} build"] = built - began
            out[f"{name} copy"] = time.perf_counter() - built
            digests.append(
                conn.execute(
                    f"SELECT count(*), sum(hashtext(k || r::text || pos || changes::text"
                    f" || fresh || deleted)) FROM stage_{name}"
                ).fetchone()
            )
    assert digests[0] == digests[1], digests
    return out


# -- the run -------------------------------------------------------------------------------


def run(env: Env, kind: str, rows: int, batch: int, mat_rows: int) -> dict[str, float]:
    typed = kind == "postgres-typed"
    plain_s = plain(env, kind, rows, batch)
    store = build(env, kind, f"b{uuid.uuid4().hex[:8]}", None)
    try:
        insert_s, update_s, stale_s = apply_rounds(store, rows, batch, typed)
    finally:
        store.close()
    out = {"plain": rows / plain_s, "insert": rows / insert_s, "update": rows / update_s}
    out["stale"] = rows / stale_s
    if mat_rows:
        mat = build(env, kind, f"m{uuid.uuid4().hex[:8]}", count_groups)
        try:
            m_insert, m_update, _ = apply_rounds(mat, mat_rows, min(batch, mat_rows), typed)
        finally:
            mat.close()
        out["mat insert"] = mat_rows / m_insert
        out["mat update"] = mat_rows / m_update
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--mat-rows", type=int, default=20_000, help="0: no materializer runs")
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--memory-keys", default="100000,1000000", help="'' for none")
    args = parser.parse_args()
    kinds = [k for k in args.stores.split(",") if k]
    unknown = set(kinds) - set(STORES)
    if unknown:
        parser.error(f"unknown stores {sorted(unknown)}: choose from {list(STORES)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the stack goes down (finally)
    settings = bench_settings()
    work = Path(tempfile.mkdtemp(prefix="tributary-bench-stores-work-"))
    stack = LocalStack(settings)
    try:
        stack.up(["postgres", "redis", "broker"])
        env = Env(settings, work)
        with psycopg.connect(env.dsn, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA IF NOT EXISTS bench")
        print(
            f"== {args.rows:,} writes per store in batches of {args.batch:,}"
            f" ({'Arrow write table' if COLUMNAR else 'Put objects'});"
            f" with a materializer: {args.mat_rows:,}"
        )
        header = f"{'store':<16}{'plain':>10}" + "".join(
            f"{c:>20}" for c in ("insert", "update", "stale", "mat insert", "mat update")
        )
        print(header)
        for kind in kinds:
            figures = run(env, kind, args.rows, args.batch, args.mat_rows)
            cells = [f"{kind:<16}{figures['plain']:>10,.0f}"]
            for name in ("insert", "update", "stale", "mat insert", "mat update"):
                if name in figures:
                    value = figures[name]
                    cells.append(f"{value:>11,.0f} ({value / figures['plain']:.2f}x)")
            print("".join(cells), flush=True)
        print("(rows/s; in brackets the ratio to the plain write of the same rows)")
        for keys in [int(k) for k in args.memory_keys.split(",") if k]:
            mem = kafka_memory(env, keys, 100_000)
            print(
                f"kafka writer at {keys:,} keys: filled in {mem['fill_s']:.1f}s; a new writer"
                f" rebuilds in {mem['rebuild_s']:.1f}s ({mem['traced_s']:.1f}s under tracemalloc)"
                f" and holds {mem['heap_mb']:,.1f} MB Python heap + {mem['arrow_mb']:,.1f} MB"
                f" Arrow (peak heap {mem['heap_peak_mb']:,.1f}"
                f" MB; RSS +{mem['rss_mb']:,.0f} MB)",
                flush=True,
            )
        if COLUMNAR:  # the store's staging functions exist
            formats = staging_formats(env, args.rows)
            print(
                f"PostgreSQL staging of {args.rows:,} rows: CSV build {formats['csv build']:.2f}s"
                f" + COPY {formats['csv copy']:.2f}s; COPY binary build"
                f" {formats['binary build']:.2f}s + COPY {formats['binary copy']:.2f}s",
                flush=True,
            )
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"process peak RSS {peak:,.0f} MB")
    finally:
        gc.collect()
        stack.down()
        shutil.rmtree(settings.home.parent, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
