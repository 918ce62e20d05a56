"""What the routes share: the settings, the views and their queries, the command gateway, the
waiter and the guards."""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi.params import Depends as DependsParam
from prometheus_client import CollectorRegistry

from infra.http_api.gateway import CommandGateway
from infra.settings import Settings
from infra.view_queries import ViewQuery, Waiter
from projections.view import View

if TYPE_CHECKING:
    from infra.telemetry.overview import Overview

__all__ = ["Api"]


@dataclass
class Api:
    """What the routes share."""

    settings: Settings
    views: list[View]
    queries: dict[str, ViewQuery]
    commands: CommandGateway
    waiter: Waiter
    command_guard: DependsParam | None = None
    read_guard: DependsParam | None = None
    metrics: CollectorRegistry = field(default_factory=CollectorRegistry)
    overview: "Overview | None" = None
