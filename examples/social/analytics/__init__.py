"""The social network's stream analytics: event time, windows, joins and patterns on Spark's
own stateful operators, each job a stateful view (its own checkpoint, its output through the
view layer's exactly-once ledger) writing PostgreSQL tables services read and a topic
``analytics.<job>`` downstream teams subscribe to.

``TRIBUTARY_ANALYTICS=examples.social.analytics:social_analytics`` runs them beside the views;
``examples.social.analytics:<job>_only`` (e.g. ``sessions_only``) runs one of them.

- ``activity`` (reads ``activity``): each event with raw and corrected times (stateless);
- ``hashtags``, ``trending`` (``events.post``): posts per hashtag in tumbling 1-minute and
  hopping 5-minute windows (Spark ``window``, update mode);
- ``sessions`` (``activity``): user sessions with a 30-minute gap
  (``transformWithStateInPandas``);
- ``ctr`` (``activity``): searches joined with their clicks within an hour, CTR per query,
  searches with no click (``transformWithStateInPandas`` per Kafka partition, then an
  aggregation per query);
- ``likes`` (``events.post``, ``cdc.public.users``): likes with both profiles as of the like
  (``transformWithState`` per user, then an aggregation per like);
- ``alerts`` (``events.post``, ``events.follows``): bursts of posts, quick unfollows
  (``transformWithState`` with timers);
- ``approx`` (``events.post``, ``activity``): hourly distinct users per hashtag
  (HyperLogLog) and search-to-click delay p50/p99 (``percentile_approx``).

The lateness rule, device-clock correction and watermarks: :mod:`projections.time`.
"""

from collections.abc import Callable
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from examples.social.analytics.common import AnalyticsConfig
    from projections.view import View
    from views.catalog import ViewsConfig

__all__ = [
    "AnalyticsConfig",
    "alerts_view",
    "analytics_config",
    "analytics_views",
    "approx_view",
    "corrected_view",
    "ctr_view",
    "hashtags_view",
    "likes_view",
    "sessions_view",
    "social_analytics",
    "trending_view",
]

# Each job's module, imported when first asked for: Spark's Python workers unpickle one job's
# functions and should not import every job with them.
_LAZY = {
    "AnalyticsConfig": "examples.social.analytics.common",
    "corrected_view": "examples.social.analytics.corrected",
    "hashtags_view": "examples.social.analytics.windows",
    "trending_view": "examples.social.analytics.windows",
    "sessions_view": "examples.social.analytics.sessions",
    "ctr_view": "examples.social.analytics.ctr",
    "likes_view": "examples.social.analytics.likes",
    "alerts_view": "examples.social.analytics.alerts",
    "approx_view": "examples.social.analytics.windows",
}
JOBS = (
    "corrected_view",
    "hashtags_view",
    "trending_view",
    "sessions_view",
    "ctr_view",
    "likes_view",
    "alerts_view",
    "approx_view",
)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    job = f"{name.removesuffix('_only')}_view"
    if name.endswith("_only") and job in JOBS:
        return _one_job(job)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _one_job(job: str) -> "Callable[[ViewsConfig], list[View]]":
    """A factory of one job: ``TRIBUTARY_ANALYTICS=examples.social.analytics:sessions_only``
    runs the sessions job alone (``<job>_only`` for any job above)."""

    def factory(config: "ViewsConfig") -> "list[View]":
        return [__getattr__(job)(analytics_config(config))]

    factory.__name__ = f"{job.removesuffix('_view')}_only"
    return factory


def analytics_config(config: "ViewsConfig") -> "AnalyticsConfig":
    """The analytics jobs' configuration from the views' configuration."""
    from examples.social.analytics.common import AnalyticsConfig
    from projections.time import Lateness

    return AnalyticsConfig(
        kafka=config.kafka,
        dsn=config.postgres_dsn,
        schema=config.views_schema,
        activity_topic=config.activity_topic,
        posts_topic=f"{config.event_topic_prefix}post",
        follows_topic=f"{config.event_topic_prefix}follows",
        users_topic=f"{config.topic_prefix}.public.users",
        subjects_topic=f"{config.event_topic_prefix}subject",
        keys=(config.catalog_dsn, config.event_store_schema),
        lateness=Lateness.of_seconds(config.allowed_lateness_s, config.lateness_slack_s),
        query_dsn=config.query_dsn,
        topic_prefix=config.analytics_topic_prefix,
        registry_url=config.schema_registry_url,
    )


def analytics_views(config: "AnalyticsConfig") -> "list[View]":
    return [__getattr__(job)(config) for job in JOBS]


def social_analytics(config: "ViewsConfig") -> "list[View]":
    """Every social analytics job (a view factory: ``module:function``)."""
    return analytics_views(analytics_config(config))
