"""The configured views: what ``tributary run views`` runs, ``tributary replay`` rebuilds and
``tributary views`` reports.

Two kinds: the mirror of each table in ``mirror_tables`` (framework-level, any table), and the
views of a domain, built by factories named ``module:function`` in ``view_factories`` (the demo's
search index, profile cache and home timeline come from ``examples.social.views``); a factory
receives this :class:`ViewsConfig` and returns its views.
"""

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from connectors.kafka import KafkaConfig
from connectors.postgres import compare_tables, table_columns
from connectors.stores.postgres import PostgresStore
from projections.mirror import mirror_table
from projections.view import View, per_partition
from views.errors import UnknownViewError


@dataclass(frozen=True)
class JobOptions:
    """How view queries run: checkpoint root, batch size cap, trigger interval, data-loss policy."""

    checkpoint_root: Path
    max_offsets_per_trigger: int | None = None
    trigger_interval_s: float = 1.0
    fail_on_data_loss: bool = True
    extra_source_options: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ViewsConfig:
    """Everything the view jobs need, built by ``infra`` from the settings."""

    kafka: KafkaConfig
    postgres_dsn: str = field(repr=False)  # URLs may hold a password: never in a repr
    views_schema: str
    checkpoint_root: Path
    mirror_tables: tuple[str, ...] = ()
    topic_prefix: str = "cdc"
    event_topic_prefix: str = "events."
    max_offsets_per_trigger: int | None = None
    replay_max_offsets_per_trigger: int | None = 500_000
    trigger_interval_s: float = 1.0
    spark_master: str = "local[2]"
    # where the captured tables live (default: postgres_dsn)
    source_dsn: str | None = field(default=None, repr=False)
    # the views' read-only role, for queries (default: postgres_dsn)
    read_dsn: str | None = field(default=None, repr=False)
    redis_url: str = field(default="redis://127.0.0.1:6379/0", repr=False)
    index_root: Path = Path("indexes")
    view_factories: tuple[str, ...] = ()
    event_store_schema: str = "event_store"
    # the schema registry events.* records' schema ids refer to
    schema_registry_url: str = "http://127.0.0.1:18081"
    # Stream analytics: factories of analytics jobs (views too, run and replayed alike), the
    # raw activity topic, the allowed lateness and the extra time Spark keeps state.
    analytics_factories: tuple[str, ...] = ()
    activity_topic: str = "activity"
    analytics_topic_prefix: str = "analytics."
    allowed_lateness_s: float = 300.0
    lateness_slack_s: float = 600.0
    extra: dict[str, Any] = field(default_factory=dict)

    def job_options(self, *, replay: bool = False, **overrides: Any) -> JobOptions:
        values: dict[str, Any] = {
            "checkpoint_root": self.checkpoint_root,
            "max_offsets_per_trigger": self.replay_max_offsets_per_trigger
            if replay
            else self.max_offsets_per_trigger,
            "trigger_interval_s": self.trigger_interval_s,
        }
        values.update(overrides)
        return JobOptions(**values)

    @property
    def catalog_dsn(self) -> str:
        return self.source_dsn or self.postgres_dsn

    @property
    def query_dsn(self) -> str:
        """Where PostgreSQL-backed view queries read (the read-only role when configured)."""
        return self.read_dsn or self.postgres_dsn


ViewFactory = Callable[[ViewsConfig], Sequence[View]]


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


def mirror_view(qualified: str, config: ViewsConfig) -> View:
    """The mirror of ``schema.table``: topic ``<prefix>.schema.table`` -> ``views.schema_table``
    with the source's column types (read from the source's catalog)."""
    schema, table = split_table(qualified)
    name = mirror_view_name(qualified)
    dsn = config.catalog_dsn
    layout = mirror_table(f"{schema}_{table}", lambda: table_columns(dsn, schema, table))

    def verify() -> list[str]:
        if config.catalog_dsn != config.postgres_dsn:
            return []  # the source is in another database: the topic check covers it
        columns = table_columns(dsn, schema, table)
        found = compare_tables(
            dsn,
            (schema, table),
            (config.views_schema, f"{schema}_{table}"),
            [c.name for c in columns],
            [c.name for c in columns if c.primary_key],
        )
        return [f"{name}: {n} {kind} rows" for kind, n in found.items() if n]

    return View(
        name=name,
        topics=(f"{config.topic_prefix}.{schema}.{table}",),
        fold=per_partition("projections.mirror:fold_changes"),
        store=PostgresStore(config.postgres_dsn, config.views_schema, name, [layout]),
        description=f"latest row per key of {qualified}",
        verify=verify,
    )


def load_factory(path: str) -> ViewFactory:
    """The view factory at ``module:function``."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise UnknownViewError(f"view factory {path!r}: write it as module:function")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise UnknownViewError(f"view factory {path!r} cannot be loaded: {exc}") from exc
    if not callable(factory):
        raise UnknownViewError(f"view factory {path!r} is not callable")
    return factory  # type: ignore[no-any-return]


def configured_views(config: ViewsConfig) -> dict[str, View]:
    """Every configured view by name: the mirrors, then each factory's views, then the
    analytics jobs."""
    views = [mirror_view(t, config) for t in config.mirror_tables]
    for path in (*config.view_factories, *config.analytics_factories):
        views.extend(load_factory(path)(config))
    return {v.name: v for v in views}


def find_view(config: ViewsConfig, name: str) -> View:
    """The configured view called ``name`` (``schema.table`` also finds its mirror)."""
    views = configured_views(config)
    if name in views:
        return views[name]
    if name.count(".") <= 1 and mirror_view_name(name) in views:
        return views[mirror_view_name(name)]
    known = ", ".join(sorted(views)) or "none (set TRIBUTARY_MIRROR_TABLES or TRIBUTARY_VIEWS)"
    raise UnknownViewError(f"no view called {name!r}; configured views: {known}")
