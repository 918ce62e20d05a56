"""The configured views: what ``tributary run views`` runs and ``tributary replay`` rebuilds."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connectors.changes import ChangeEvent
from connectors.kafka import KafkaConfig
from projections.mirror import MirrorProjection, MirrorWrite, decode_change
from projections.mirror_table import MirrorTable
from projections.mirror_target import MirrorTarget
from projections.view import ViewSpec
from spark_streaming.errors import UnknownViewError
from spark_streaming.view_job import JobOptions

MirrorSpec = ViewSpec[ChangeEvent, MirrorWrite]


@dataclass(frozen=True)
class ViewsConfig:
    """Everything the view jobs need, built by ``infra`` from the settings."""

    kafka: KafkaConfig
    postgres_dsn: str
    views_schema: str
    checkpoint_root: Path
    mirror_tables: tuple[str, ...] = ()
    topic_prefix: str = "cdc"
    max_offsets_per_trigger: int | None = None
    trigger_interval_s: float = 1.0
    spark_master: str = "local[2]"

    def job_options(self, **overrides: Any) -> JobOptions:
        values: dict[str, Any] = {
            "checkpoint_root": self.checkpoint_root,
            "max_offsets_per_trigger": self.max_offsets_per_trigger,
            "trigger_interval_s": self.trigger_interval_s,
        }
        values.update(overrides)
        return JobOptions(**values)


def split_table(qualified: str) -> tuple[str, str]:
    """``schema.table`` (``table`` alone means ``public.table``)."""
    parts = qualified.split(".")
    if len(parts) == 1:
        return "public", parts[0]
    if len(parts) == 2 and all(parts):
        return parts[0], parts[1]
    raise UnknownViewError(f"mirror table {qualified!r}: write it as schema.table")


def mirror_view_name(qualified: str) -> str:
    schema, table = split_table(qualified)
    return f"mirror.{schema}.{table}"


def mirror_view(
    qualified: str, postgres_dsn: str, views_schema: str, topic_prefix: str = "cdc"
) -> MirrorSpec:
    """The mirror of ``schema.table``: topic ``<prefix>.schema.table`` -> ``views.schema_table``."""
    schema, table = split_table(qualified)
    name = mirror_view_name(qualified)
    target = MirrorTarget(postgres_dsn, name, MirrorTable(views_schema, f"{schema}_{table}"))
    return ViewSpec(
        name=name,
        topics=(f"{topic_prefix}.{schema}.{table}",),
        decoder=decode_change,
        projection=MirrorProjection(),
        target=target,
        # A CDC topic is keyed by primary key, so folding per partition is correct; on a
        # 2-core local[2] driver it measured slower than folding on the driver (bench/replay.py).
        per_partition=False,
    )


def configured_views(config: ViewsConfig) -> dict[str, MirrorSpec]:
    """Every configured view by name."""
    views = [
        mirror_view(t, config.postgres_dsn, config.views_schema, config.topic_prefix)
        for t in config.mirror_tables
    ]
    return {v.name: v for v in views}


def find_view(config: ViewsConfig, name: str) -> MirrorSpec:
    """The configured view called ``name`` (``schema.table`` also finds its mirror)."""
    views = configured_views(config)
    if name in views:
        return views[name]
    if name.count(".") <= 1 and mirror_view_name(name) in views:
        return views[mirror_view_name(name)]
    known = ", ".join(sorted(views)) or "none (set TRIBUTARY_MIRROR_TABLES)"
    raise UnknownViewError(f"no view called {name!r}; configured views: {known}")
