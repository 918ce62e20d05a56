"""The engine-free shape of a view: decoder, projection, sink, and one batch run through them."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, Protocol, TypeVar

T = TypeVar("T")
W = TypeVar("W")
T_co = TypeVar("T_co", covariant=True)
T_contra = TypeVar("T_contra", contravariant=True)
W_co = TypeVar("W_co", covariant=True)
W_contra = TypeVar("W_contra", contravariant=True)

Headers = tuple[tuple[str, bytes | None], ...]


class KafkaRecord(NamedTuple):
    """One Kafka record as a view sees it (the columns of Spark's Kafka source).

    A named tuple: batches hold hundreds of thousands of them.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class Rejection:
    """A record the view could not use, and why: it goes to ``<topic>.dlq``."""

    record: KafkaRecord
    stage: str  # "decode" or "project"
    error: BaseException

    @property
    def reason(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"


class Decoder(Protocol[T_co]):
    """Turns a Kafka record into the view's input; raises to reject the record."""

    def __call__(self, record: KafkaRecord) -> T_co: ...


class Projection(Protocol[T_contra, W_co]):
    """Folds the decoded inputs of one batch, in offset order, into writes for the sink.

    ``reject(item, error)`` sends one input to the dead-letter queue instead of failing the batch.
    """

    def __call__(
        self,
        items: Sequence[tuple[KafkaRecord, T_contra]],
        reject: Callable[[KafkaRecord, BaseException], None],
    ) -> Sequence[W_co]: ...


class Sink(Protocol[W_contra]):
    """Applies one batch's writes and records ``batch_id`` in the same transaction.

    Returns False when ``batch_id`` was already applied (the batch is skipped whole).
    ``offsets`` are the next offsets per topic and partition after this batch.
    """

    def apply(
        self, batch_id: int, writes: Sequence[W_contra], offsets: Mapping[str, Mapping[str, int]]
    ) -> bool: ...


@dataclass(frozen=True)
class ProjectedBatch(Generic[W]):
    """What one batch became: writes for the sink, rejected records, next offsets."""

    writes: Sequence[W]
    rejections: list[Rejection] = field(default_factory=list)
    offsets: dict[str, dict[str, int]] = field(default_factory=dict)
    records: int = 0


def merge_projected(parts: Sequence[ProjectedBatch[W]]) -> ProjectedBatch[W]:
    """One batch from batches projected apart (one per partition; keys never span partitions)."""
    writes: list[W] = []
    rejections: list[Rejection] = []
    offsets: dict[str, dict[str, int]] = {}
    for part in parts:
        writes.extend(part.writes)
        rejections.extend(part.rejections)
        for topic, ends in part.offsets.items():
            merged = offsets.setdefault(topic, {})
            for partition, offset in ends.items():
                merged[partition] = max(merged.get(partition, 0), offset)
    return ProjectedBatch(writes, rejections, offsets, sum(p.records for p in parts))


def project_batch(
    records: Sequence[KafkaRecord],
    decoder: Decoder[T],
    projection: Projection[T, W],
) -> ProjectedBatch[W]:
    """Decode and project one batch; records that fail go to the rejections, the rest on.

    Records are taken in (topic, partition, offset) order so per-key order is the log's order.
    """
    ordered = sorted(records, key=lambda r: (r.topic, r.partition, r.offset))
    rejections: list[Rejection] = []
    decoded: list[tuple[KafkaRecord, T]] = []
    offsets: dict[str, dict[str, int]] = {}
    for record in ordered:
        ends = offsets.setdefault(record.topic, {})
        ends[str(record.partition)] = max(ends.get(str(record.partition), 0), record.offset + 1)
        try:
            decoded.append((record, decoder(record)))
        except Exception as exc:
            rejections.append(Rejection(record, "decode", exc))

    def reject(record: KafkaRecord, error: BaseException) -> None:
        rejections.append(Rejection(record, "project", error))

    writes = projection(decoded, reject)
    return ProjectedBatch(writes, rejections, offsets, len(ordered))


class ViewTarget(Protocol[W_contra]):
    """Where a view's generations live (tables, index folders, key prefixes).

    The live generation serves reads; a rebuild writes a shadow generation that
    :meth:`swap_in` makes live atomically, or :meth:`discard` throws away.
    """

    def live_generation(self) -> str: ...

    def sink(
        self,
        generation: str,
        *,
        live: bool,
        before_commit: Callable[[int], None] | None = None,
        after_commit: Callable[[int], None] | None = None,
    ) -> Sink[W_contra]: ...

    def prepare(self, generation: str) -> None: ...

    def generations(self) -> set[str]: ...

    def discard(self, generation: str) -> None: ...

    def swap_in(self, generation: str) -> str | None: ...


@dataclass(frozen=True)
class ViewSpec(Generic[T, W]):
    """A view: its name, the topics it reads, and its decoder, projection and target.

    ``per_partition``: the projection may fold each Kafka partition apart (true when every key
    lives in one partition, as with keyed topics), so an engine can run it in parallel.
    """

    name: str
    topics: tuple[str, ...]
    decoder: Decoder[T]
    projection: Projection[T, W]
    target: ViewTarget[W]
    per_partition: bool = False
