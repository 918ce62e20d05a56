"""The demo's three views: a search index (tantivy), a profile cache (Redis) and a home
timeline (PostgreSQL), built from the posts and follows events and the users table.

``TRIBUTARY_VIEWS=examples.social.views:social_views`` runs them beside the mirrors.
"""

from dataclasses import replace
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from projections.view import View
    from views.catalog import ViewsConfig

__all__ = ["profile_view", "search_view", "social_views", "timeline_view"]

# Imported when first asked for: Spark's Python workers unpickle a view's fold from
# `examples.social.views.folds`, and should not import every view's store and checks with it
# (about 1 s of imports in each worker a cold driver starts).
_LAZY = {
    "profile_view": "examples.social.views.profile",
    "search_view": "examples.social.views.search",
    "timeline_view": "examples.social.views.timeline",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def social_views(config: "ViewsConfig") -> "list[View]":
    """The search, profile and timeline views with the configured stores and topics."""
    from examples.social.views.checks import check_profiles, check_search, check_timelines
    from examples.social.views.profile import profile_view
    from examples.social.views.search import search_view
    from examples.social.views.timeline import timeline_view

    users = f"{config.topic_prefix}.public.users"
    posts = f"{config.event_topic_prefix}post"
    follows = f"{config.event_topic_prefix}follows"
    subjects = f"{config.event_topic_prefix}subject"  # SubjectForgotten: purge the user
    source, events = config.catalog_dsn, config.event_store_schema
    registry = config.schema_registry_url
    keys = (source, events)  # the event store's subject keys decrypt personal fields
    search = search_view(
        config.index_root, (posts, users, subjects), registry_url=registry, keys=keys
    )
    profile = profile_view(
        config.redis_url, (users, follows, posts, subjects), registry_url=registry, keys=keys
    )
    timeline = timeline_view(
        config.postgres_dsn,
        config.views_schema,
        (posts, follows, subjects),
        read_dsn=config.read_dsn,
        registry_url=registry,
        keys=keys,
    )
    return [
        replace(search, verify=check_search(search, source, events)),
        replace(profile, verify=check_profiles(profile, source, events)),
        replace(
            timeline,
            verify=check_timelines(timeline, config.postgres_dsn, config.views_schema, events),
        ),
    ]
