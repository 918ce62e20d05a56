"""One streaming query per view: Kafka source -> foreachBatch(decode, project, sink).

Each generation of a view has its own checkpoint (``<root>/<view>/<generation>``). The sink
stores the batch id with the data in one transaction, so a batch Spark re-runs after a crash is
skipped; rejected records go to the dead-letter queue before the sink commits.
"""

import pickle
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import pyarrow as pa  # type: ignore[import-untyped]

from connectors.kafka import KafkaConfig
from projections.view import (
    Decoder,
    KafkaRecord,
    ProjectedBatch,
    Projection,
    ViewSpec,
    merge_projected,
    project_batch,
)
from spark_streaming.dead_letters import DeadLetterQueue
from spark_streaming.stream import kafka_stream

T = TypeVar("T")
W = TypeVar("W")


@dataclass(frozen=True)
class JobOptions:
    """How view queries run: checkpoint root, batch size cap, trigger interval, data-loss policy."""

    checkpoint_root: Path
    max_offsets_per_trigger: int | None = None
    trigger_interval_s: float = 1.0
    fail_on_data_loss: bool = True
    extra_source_options: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CommitHooks:
    """Callbacks around the sink's commit, with the batch id (fault-injection points)."""

    before_commit: Callable[[int], None] | None = None
    after_commit: Callable[[int], None] | None = None


@dataclass(frozen=True)
class BatchReport:
    """What one micro-batch did."""

    view: str
    generation: str
    batch_id: int
    records: int
    rejected: int
    applied: bool
    offsets: dict[str, dict[str, int]]


def checkpoint_dir(root: Path, view: str, generation: str) -> Path:
    """The checkpoint folder of one generation of a view."""
    return root / view / generation


def records_from_arrow(table: pa.Table) -> list[KafkaRecord]:
    """Kafka records from the Arrow form of a batch of the Kafka source."""
    if table.num_rows == 0:
        return []
    stamps = table.column("timestamp").cast(pa.int64()).to_pylist()
    headers = [
        () if hs is None else tuple((h["key"], h["value"]) for h in hs)
        for hs in table.column("headers").to_pylist()
    ]
    return list(
        map(
            KafkaRecord,
            table.column("topic").to_pylist(),
            table.column("partition").to_pylist(),
            table.column("offset").to_pylist(),
            table.column("key").to_pylist(),
            table.column("value").to_pylist(),
            headers,
            [None if ts is None else ts // 1000 for ts in stamps],
        )
    )


PROJECTED_COLUMN = "projected binary"
_PROJECTED_SCHEMA = pa.schema([pa.field("projected", pa.binary())])


def partition_projector(
    decoder: Decoder[T], projection: Projection[T, W]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: one partition's records in, its pickled
    :class:`ProjectedBatch` out (one row)."""

    def project_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        chunks = list(batches)
        records = records_from_arrow(pa.Table.from_batches(chunks)) if chunks else []
        projected = project_batch(records, decoder, projection)
        payload = pickle.dumps(projected, protocol=pickle.HIGHEST_PROTOCOL)
        yield pa.RecordBatch.from_arrays(
            [pa.array([payload], pa.binary())], schema=_PROJECTED_SCHEMA
        )

    return project_partition


class ViewJob(Generic[T, W]):
    """Runs one generation of one view as a streaming query."""

    def __init__(
        self,
        spark: Any,
        spec: ViewSpec[T, W],
        kafka: KafkaConfig,
        options: JobOptions,
        *,
        generation: str | None = None,
        live: bool = True,
        hooks: CommitHooks | None = None,
        on_batch: Callable[[BatchReport], None] | None = None,
    ) -> None:
        self.spark = spark
        self.spec = spec
        self.kafka = kafka
        self.options = options
        self.live = live
        self.generation = generation or spec.target.live_generation()
        hooks = hooks or CommitHooks()
        self.sink = spec.target.sink(
            self.generation,
            live=live,
            before_commit=hooks.before_commit,
            after_commit=hooks.after_commit,
        )
        self.dead_letters = DeadLetterQueue(kafka, spec.name)
        self.on_batch = on_batch

    @property
    def checkpoint(self) -> Path:
        return checkpoint_dir(self.options.checkpoint_root, self.spec.name, self.generation)

    def source_options(self) -> dict[str, str]:
        opts = {
            "kafka.bootstrap.servers": self.kafka.bootstrap_servers,
            "subscribe": ",".join(self.spec.topics),
            "startingOffsets": "earliest",
            "failOnDataLoss": str(self.options.fail_on_data_loss).lower(),
        }
        opts.update({f"kafka.{k}": v for k, v in self.kafka.extra.items()})
        if self.options.max_offsets_per_trigger is not None:
            opts["maxOffsetsPerTrigger"] = str(self.options.max_offsets_per_trigger)
        opts.update(self.options.extra_source_options)
        return opts

    def prune_checkpoints(self) -> list[Path]:
        """Remove the checkpoints of retired generations (replaced by a replay) of this view."""
        folder = self.checkpoint.parent
        if not folder.is_dir():
            return []
        in_use = self.spec.target.generations() | {self.generation}
        retired = [p for p in folder.iterdir() if p.is_dir() and p.name not in in_use]
        for path in retired:
            shutil.rmtree(path, ignore_errors=True)
        return retired

    def start(self, *, available_now: bool = False) -> Any:
        """Start the query (``available_now``: read what is there now, then stop).

        A live job first removes checkpoints of retired generations: a replay leaves the old
        one in place because a job may still be running on it.
        """
        if self.live:
            self.prune_checkpoints()
        stream = kafka_stream(self.spark, self.source_options())
        writer = (
            stream.writeStream.queryName(f"{self.spec.name}.{self.generation}")
            .option("checkpointLocation", str(self.checkpoint))
            .foreachBatch(self.handle_batch)
        )
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{self.options.trigger_interval_s} seconds")
        return writer.start()

    def sink_close(self) -> None:
        """Release the sink's connection (the target keeps the data)."""
        close = getattr(self.sink, "close", None)
        if callable(close):
            close()

    def project(self, batch: Any) -> ProjectedBatch[W]:
        """Decode and project a micro-batch: per partition on the executors when the view
        allows it (only the folded writes come back to the driver), else on the driver."""
        if not self.spec.per_partition:
            records = records_from_arrow(batch.toArrow())
            return project_batch(records, self.spec.decoder, self.spec.projection)
        projector = partition_projector(self.spec.decoder, self.spec.projection)
        parts = batch.mapInArrow(projector, PROJECTED_COLUMN).toArrow()
        return merge_projected([pickle.loads(p) for p in parts.column(0).to_pylist()])

    def handle_batch(self, batch: Any, batch_id: int) -> None:
        """foreachBatch body: decode, project, dead-letter the rejects, apply with the batch id."""
        projected = self.project(batch)
        self.dead_letters.send(projected.rejections)
        applied = self.sink.apply(batch_id, projected.writes, projected.offsets)
        if self.on_batch is not None:
            self.on_batch(
                BatchReport(
                    self.spec.name,
                    self.generation,
                    batch_id,
                    projected.records,
                    len(projected.rejections),
                    applied,
                    projected.offsets,
                )
            )
