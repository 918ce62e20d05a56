"""The app: what the routes share (:class:`Api`) and :func:`create_app`, which puts the routes
of each concern together (commands, health, metrics, the dashboard, the views' queries; errors
and auth)."""

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI

from event_store import CommandBus
from infra.http_api.api import Api
from infra.http_api.auth import command_guard, read_guard
from infra.http_api.commands import add_command_route
from infra.http_api.dashboard import add_dashboard_routes
from infra.http_api.errors import install_error_handlers
from infra.http_api.forget import add_forget_route
from infra.http_api.gateway import CommandGateway
from infra.http_api.health import add_health_route
from infra.http_api.metrics import add_metrics_route, serve_registry
from infra.http_api.queries import add_query_route
from infra.settings import Settings
from infra.telemetry.overview import Overview
from infra.view_queries import LazyWaiter, Waiter, declared_queries, default_waiter
from projections.view import View
from tributary.redact import install_log_redaction, register_secret

__all__ = ["create_app"]


def create_app(
    settings: Settings,
    *,
    views: Sequence[View] | Mapping[str, View] | None = None,
    bus: CommandBus | None = None,
    waiter: Waiter | None = None,
) -> FastAPI:
    """The API over ``views`` (default: the configured views), running commands through
    ``bus`` (default: built from the settings like the processor's) and waiting for tokens
    with ``waiter`` (default: ``views.read_your_writes.ViewWaiter``, loaded on the
    first wait). Raises :class:`~tributary.errors.TributaryError` when the views or the
    command handlers cannot be loaded, or the views' queries cannot be served together."""
    if views is None:
        from infra.views import views_config
        from views.catalog import configured_views

        views = configured_views(views_config(settings))
    install_log_redaction()
    register_secret(*settings.secret_values())  # also when built without validation
    view_list = list(views.values()) if isinstance(views, Mapping) else list(views)
    if waiter is None:
        waiter = LazyWaiter(lambda: default_waiter(view_list, settings))
    overview = Overview(settings, view_list)
    registry, commands = serve_registry(settings, view_list, overview)
    api = Api(
        settings,
        view_list,
        declared_queries(view_list),
        CommandGateway(settings, bus, observer=commands.observe),
        waiter,
        command_guard(settings),
        read_guard(settings),
        registry,
        overview,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:  # the dashboard's sampler stops with the app, not at the process's end
            overview.close()

    app = FastAPI(
        title="Tributary",
        version="0.1.0",
        description="Commands in (the event store's command bus), views out (their queries).",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    add_command_route(app, api)
    add_forget_route(app, api)
    add_health_route(app, api)
    add_metrics_route(app, api)
    add_dashboard_routes(app, api)
    for entry in api.queries.values():
        add_query_route(app, api, entry)
    return app
