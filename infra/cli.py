"""The ``tributary`` command line: the app plus every command module that registers on it.

``main`` (the ``tributary`` script, ``python -m infra.cli``) imports only the module of the
command it is asked for (:data:`COMMAND_MODULES`): each module registers its commands on the
app when imported, and the typer annotations of the other twenty commands, the CLI plug-ins
and building them all into the click group cost ~50 ms of every start. Help, an unknown
command or a plug-in's command get the whole app, as does ``from infra.cli import app``.
"""

import sys
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.cli_app import RedactingTyper, app

__all__ = ["COMMAND_MODULES", "app", "main"]

#: Each built-in command (a sub-app's name for ``dlq`` and ``schemas``) and the module that
#: registers it (a unit test holds this to the whole app's commands).
COMMAND_MODULES = {
    "alerts": "infra.cli_analytics",
    "snapshot": "infra.cli_cdc",
    "connector-config": "infra.cli_cdc",
    "cdc-status": "infra.cli_cdc",
    "cdc-archive": "infra.cli_cdc",
    "dlq": "infra.cli_dlq",
    "run-commands": "infra.cli_events",
    "command": "infra.cli_events",
    "query": "infra.cli_query",
    "run": "infra.cli_run",
    "demo": "infra.cli_run",
    "schemas": "infra.cli_schemas",
    "serve": "infra.cli_serve",
    "up": "infra.cli_stack",
    "down": "infra.cli_stack",
    "status": "infra.cli_stack",
    "topics": "infra.cli_stack",
    "forget": "infra.cli_forget",
    "verify": "infra.cli_verify",
    "repair": "infra.cli_verify",
    "run-views": "infra.cli_views",
    "replay": "infra.cli_views",
    "spark-archive": "infra.cli_views",
    "views": "infra.cli_views",
    "grant-read-role": "infra.cli_views",
}


def whole_app() -> "RedactingTyper":
    """The app with every command module and the CLI plug-ins registered on it."""
    from infra.cli_app import app
    from infra.plugins import add_cli_plugins

    if not app.whole:
        for module in sorted(set(COMMAND_MODULES.values())):
            import_module(module)
        add_cli_plugins(app)
        app.whole = True
    return app


def __getattr__(name: str) -> Any:  # PEP 562: `from infra.cli import app`
    if name == "app":
        return whole_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Run the command line: with only the named command's module when it is a built-in."""
    module = COMMAND_MODULES.get(sys.argv[1]) if len(sys.argv) > 1 else None
    if module is None:
        whole_app()()
        return
    from infra.cli_app import app

    import_module(module)
    app()


if __name__ == "__main__":
    main()
