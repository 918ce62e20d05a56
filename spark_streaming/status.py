"""Where each view stands: live generation, last batch id, offsets, and lag behind the topics."""

from dataclasses import dataclass
from typing import Any

import psycopg

from connectors.kafka import KafkaConfig, TopicAdmin
from projections.ledger import ViewLedger, ViewPosition
from projections.view import ViewSpec


@dataclass(frozen=True)
class ViewStatus:
    """A view's position and how far it is behind the true ends of its topics."""

    view: str
    generation: str | None
    batch_id: int
    offsets: dict[str, dict[str, int]]
    ends: dict[str, dict[str, int]]

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
            "generation": self.generation,
            "batch_id": self.batch_id,
            "offsets": self.offsets,
            "end_offsets": self.ends,
            "lag": self.lag,
        }


def view_statuses(
    specs: list[ViewSpec[Any, Any]], kafka: KafkaConfig, dsn: str, views_schema: str
) -> list[ViewStatus]:
    """The status of each view (a view never run shows batch -1 and its whole topic as lag)."""
    positions = _positions(dsn, views_schema)
    admin = TopicAdmin(kafka)
    existing = set(admin.topic_names())
    out = []
    for spec in specs:
        topics = [t for t in spec.topics if t in existing]
        ends = {
            info.name: {str(p.partition): p.end_offset for p in info.partitions}
            for info in admin.describe(topics)
        }
        position = positions.get(spec.name)
        out.append(
            ViewStatus(
                spec.name,
                None if position is None else position.generation,
                -1 if position is None else position.batch_id,
                {} if position is None else position.offsets,
                ends,
            )
        )
    return out


def _positions(dsn: str, views_schema: str) -> dict[str, ViewPosition]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT to_regclass(%s)", (f'"{views_schema}"._view_batches',)
        ).fetchone()
        if row is None or row[0] is None:
            return {}
        return {p.view: p for p in ViewLedger(views_schema).positions(conn)}
