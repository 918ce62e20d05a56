"""The store backends the contract suite runs against, built from plain values so a child
process (the kill -9 tests) can build the same store."""

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tributary.view_model import Applied, Put
from tributary.view_store import Collection, Materializer, StoreTxn, ViewStore

KINDS = ("postgres", "redis", "tantivy", "kafka")

COLLECTIONS = (Collection("items", lookups=("group",)), Collection("groups"))


def count_groups(txn: StoreTxn, applied: Sequence[Applied]) -> None:
    """The contract's materializer: live items per group, recounted with ``find`` (which must
    see this batch's own writes) for every group an applied write touched."""
    touched: set[str] = set()
    for change in applied:
        if change.write.collection != "items":
            continue
        if change.before is not None and change.before.get("group") is not None:
            touched.add(str(change.before["group"]))
        if isinstance(change.write, Put) and change.write.fields.get("group") is not None:
            touched.add(str(change.write.fields["group"]))
    for group in sorted(touched):
        members = txn.find("items", "group", group)
        if members:
            txn.put("groups", group, {"count": len(members)})
        else:
            txn.delete("groups", group)


@dataclass(frozen=True)
class StoreSpec:
    """Everything needed to build one store: which backend, where, which view."""

    kind: str
    view: str
    postgres_dsn: str
    redis_url: str
    bootstrap_servers: str
    root: str
    kafka_extra: dict[str, str] = field(default_factory=dict)  # a brought Kafka's security
    schema: str = "contract"
    materialized: bool = True

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "StoreSpec":
        return cls(**json.loads(text))


def build(spec: StoreSpec, materializer: Materializer | None = None) -> ViewStore:
    """The store of ``spec``; its materializer ``count_groups`` unless another is given."""
    if materializer is None and spec.materialized:
        materializer = count_groups
    if spec.kind == "postgres":
        from connectors.stores.postgres import PostgresStore

        return PostgresStore(spec.postgres_dsn, spec.schema, spec.view, COLLECTIONS, materializer)
    if spec.kind == "redis":
        from connectors.stores.redis import RedisStore

        return RedisStore(spec.redis_url, spec.view, COLLECTIONS, materializer)
    if spec.kind == "tantivy":
        from connectors.stores.tantivy import TantivyStore

        return TantivyStore(Path(spec.root), spec.view, COLLECTIONS, materializer)
    if spec.kind == "kafka":
        from connectors.kafka import KafkaConfig
        from connectors.stores.kafka import KafkaStore

        kafka = KafkaConfig(spec.bootstrap_servers, client_id="contract", extra=spec.kafka_extra)
        return KafkaStore(kafka, spec.view, COLLECTIONS, materializer)
    raise ValueError(f"unknown store kind {spec.kind}")


def _main(argv: list[str]) -> None:
    """Child process: apply one batch and SIGKILL itself just before the store commits."""
    import os
    import signal

    from tributary.view_model import Batch, Delete
    from tributary.view_store import CommitHooks

    spec = StoreSpec.from_json(argv[1])
    batch: dict[str, Any] = json.loads(argv[2])
    store = build(spec)
    writes = [
        Put("items", w["key"], w["position"], w["fields"])
        if w.get("fields") is not None
        else Delete("items", w["key"], w["position"])
        for w in batch["writes"]
    ]

    def die(_batch_id: int) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    writer = store.writer(batch["generation"], live=True, hooks=CommitHooks(before_commit=die))
    writer.apply(Batch(batch["batch_id"], batch["offsets"], writes))
    raise SystemExit("the store committed without calling before_commit")


if __name__ == "__main__":
    _main(sys.argv)
