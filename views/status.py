"""Where each view stands, as its store says: live generation, last batch, offsets, and the lag
behind the true ends of its topics. Works for every store kind."""

from collections.abc import Sequence
from dataclasses import dataclass

from connectors.kafka import KafkaConfig, TopicAdmin, TopicInfo
from projections.view import View
from tributary.errors import TributaryError


@dataclass(frozen=True)
class ViewStatus:
    """A view's position (from its store's ledger) and how far it is behind its topics."""

    view: str
    store: str
    generation: str | None
    batch_id: int
    batches: int
    offsets: dict[str, dict[str, int]]
    ends: dict[str, dict[str, int]]
    error: str | None = None
    metrics: dict[str, int] | None = None  # the view's counters (e.g. late events)

    @property
    def lag(self) -> int:
        return sum(
            max(0, end - self.offsets.get(topic, {}).get(partition, 0))
            for topic, parts in self.ends.items()
            for partition, end in parts.items()
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "view": self.view,
            "store": self.store,
            "generation": self.generation,
            "batch_id": self.batch_id,
            "batches": self.batches,
            "offsets": self.offsets,
            "end_offsets": self.ends,
            "lag": self.lag,
            "error": self.error,
            "metrics": self.metrics,
        }


def view_statuses(
    views: Sequence[View], kafka: KafkaConfig, topics: Sequence[TopicInfo] | None = None
) -> list[ViewStatus]:
    """The status of each view (a view never run shows batch -1 and its whole topics as lag;
    a store that cannot be reached shows the error). ``topics``: the topics described already
    (with their true ends), else they are described here."""
    if topics is None:
        admin = TopicAdmin(kafka)
        wanted = sorted({t for view in views for t in view.topics} & set(admin.topic_names()))
        topics = admin.describe(wanted)
    described = {
        info.name: {str(p.partition): p.end_offset for p in info.partitions} for info in topics
    }
    out = []
    for view in views:
        ends = {t: described[t] for t in view.topics if t in described}
        try:
            generation = view.store.live_generation() if view.store.generations() else None
            commit = None if generation is None else view.store.committed(generation)
        except TributaryError as exc:
            out.append(
                ViewStatus(view.name, view.store.describe(), None, -1, 0, {}, ends, str(exc))
            )
            continue
        error, metrics = None, None
        if view.metrics is not None and commit is not None:
            try:
                metrics = view.metrics()
            except TributaryError as exc:
                error = f"metrics: {exc}"
        out.append(
            ViewStatus(
                view.name,
                view.store.describe(),
                generation,
                -1 if commit is None else commit.batch_id,
                0 if commit is None else commit.batches,
                {} if commit is None else commit.offsets,
                ends,
                error,
                metrics,
            )
        )
    return out
