"""The ``tributary`` command line: the app plus every command module that registers on it."""

from infra import (  # noqa: F401  (each module registers its commands)
    cli_analytics,
    cli_cdc,
    cli_dlq,
    cli_events,
    cli_query,
    cli_run,
    cli_schemas,
    cli_serve,
    cli_stack,
    cli_verify,
    cli_views,
)
from infra.cli_app import app
from infra.plugins import add_cli_plugins

__all__ = ["app", "main"]

add_cli_plugins(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
