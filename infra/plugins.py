"""What the settings name as ``module:attribute`` (command handlers, the demo, CLI plug-ins),
loaded by name: the framework never imports a domain (``examples/``) itself."""

import importlib
from typing import Any

import typer

from tributary.errors import TributaryError

__all__ = ["DEFAULT_CLI_PLUGINS", "add_cli_plugins", "load_named"]

#: The demo domain's commands (``tributary activity …``), added unless the setting says
#: otherwise.
DEFAULT_CLI_PLUGINS = "examples.social.activity_cli:activity_app"


def load_named(spec: str, what: str, variable: str, default_attribute: str) -> tuple[Any, Any]:
    """The object named by ``spec`` (``module:attribute``; ``default_attribute`` when the part
    after the colon is empty) and its module; a :class:`TributaryError` naming the setting
    ``variable`` when it cannot be imported."""
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
        target = getattr(module, attribute or default_attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise TributaryError(
            f"cannot load {what} {spec!r}: {exc}; set {variable} to module:attribute"
        ) from exc
    return target, module


def add_cli_plugins(app: typer.Typer) -> None:
    """Add the Typer apps the ``cli_plugins`` setting names (``module:app``, comma-separated)
    to the CLI. With settings that do not validate, the default plug-ins are added (every
    command that needs the settings then says what is wrong); a plug-in that cannot be loaded
    is left out."""
    from pydantic import ValidationError

    from infra.settings import load_settings

    try:
        specs = load_settings().cli_plugins
    except (ValidationError, ValueError, OSError):
        specs = DEFAULT_CLI_PLUGINS
    for spec in (s.strip() for s in specs.split(",")):
        if not spec:
            continue
        try:
            plugin, _ = load_named(spec, "CLI plug-in", "TRIBUTARY_CLI_PLUGINS", "app")
        except TributaryError:
            continue
        if isinstance(plugin, typer.Typer):
            app.add_typer(plugin)
