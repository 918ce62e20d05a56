"""What the settings name as ``module:attribute`` (command handlers, the demo, CLI plug-ins),
loaded by name: the framework never imports a domain (``examples/``) itself."""

import importlib
import os
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
    """Add the Typer apps ``TRIBUTARY_CLI_PLUGINS`` names (``module:app``, comma-separated) to
    the CLI. Read from the environment before the settings are validated, so ``--help`` and
    every other command work whatever else is set; a plug-in that cannot be loaded is left
    out (``tributary settings`` and any command needing the settings say what is wrong)."""
    specs = os.environ.get("TRIBUTARY_CLI_PLUGINS", DEFAULT_CLI_PLUGINS)
    for spec in (s.strip() for s in specs.split(",")):
        if not spec:
            continue
        try:
            plugin, _ = load_named(spec, "CLI plug-in", "TRIBUTARY_CLI_PLUGINS", "app")
        except TributaryError:
            continue
        if isinstance(plugin, typer.Typer):
            app.add_typer(plugin)
