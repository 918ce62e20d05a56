"""The view side wired from the settings: the view jobs' configuration and the
read-your-writes waiter over the configured views."""

from collections.abc import Sequence
from typing import TYPE_CHECKING

from infra.stack.spark import resolve_master
from views.catalog import ViewsConfig, configured_views

if TYPE_CHECKING:  # pydantic's settings and the waiter's driver: not for `tributary views`
    from infra.settings import Settings
    from projections.view import View
    from views.read_your_writes import ViewWaiter

__all__ = ["view_waiter", "views_config"]


def views_config(s: "Settings") -> ViewsConfig:
    """The view jobs' configuration from the settings."""
    return ViewsConfig(
        kafka=s.kafka("tributary-views"),
        postgres_dsn=s.postgres().dsn,
        read_dsn=None if s.views_read_url is None else s.views_read_postgres().dsn,
        views_schema=s.views_schema,
        checkpoint_root=(s.view_checkpoint_dir or s.home / "checkpoints").resolve(),
        mirror_tables=tuple(t.strip() for t in s.mirror_tables.split(",") if t.strip()),
        topic_prefix=s.cdc_topic_prefix,
        event_topic_prefix=s.event_topic_prefix,
        max_offsets_per_trigger=s.view_max_offsets_per_trigger,
        replay_max_offsets_per_trigger=s.view_replay_max_offsets_per_trigger,
        trigger_interval_s=s.view_trigger_interval_s,
        spark_master=resolve_master(
            s.spark_master, s.home, s.spark_master_port, s.spark_master_ui_port
        ),
        redis_url=s.cache_url,
        index_root=(s.index_dir or s.home / "indexes").resolve(),
        view_factories=tuple(f.strip() for f in s.views.split(",") if f.strip()),
        event_store_schema=s.event_store_schema,
        schema_registry_url=s.registry_url,
        analytics_factories=tuple(f.strip() for f in s.analytics.split(",") if f.strip()),
        activity_topic=s.activity_topic,
        analytics_topic_prefix=s.analytics_topic_prefix,
        allowed_lateness_s=s.allowed_lateness_s,
        lateness_slack_s=s.lateness_slack_s,
    )


def view_waiter(s: "Settings", views: "Sequence[View] | None" = None) -> "ViewWaiter":
    """A waiter over ``views`` (default: the configured views, mirrors and factories)."""
    from views.read_your_writes import ViewWaiter

    if views is None:
        views = list(configured_views(views_config(s)).values())
    return ViewWaiter(views, s.postgres().dsn, s.event_store_schema, s.event_topic_prefix)
