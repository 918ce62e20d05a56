"""The demo's three views: a search index (tantivy), a profile cache (Redis) and a home
timeline (PostgreSQL), built from the posts and follows events and the users table.

``TRIBUTARY_VIEWS=examples.social.views:social_views`` runs them beside the mirrors.
"""

from examples.social.views.profile import profile_view
from examples.social.views.search import search_view
from examples.social.views.timeline import timeline_view
from projections.view import View
from spark_streaming.views import ViewsConfig

__all__ = ["profile_view", "search_view", "social_views", "timeline_view"]


def social_views(config: ViewsConfig) -> list[View]:
    """The search, profile and timeline views with the configured stores and topics."""
    users = f"{config.topic_prefix}.public.users"
    posts = f"{config.event_topic_prefix}post"
    follows = f"{config.event_topic_prefix}follows"
    return [
        search_view(config.index_root, (posts, users)),
        profile_view(config.redis_url, (users, follows, posts)),
        timeline_view(config.postgres_dsn, config.views_schema, (posts, follows)),
    ]
