"""What the routes share: the settings, the views and their queries, the command gateway, the
waiter and the guards."""

from dataclasses import dataclass

from fastapi.params import Depends as DependsParam

from infra.http_api.gateway import CommandGateway
from infra.settings import Settings
from infra.view_queries import ViewQuery, Waiter
from projections.view import View

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
