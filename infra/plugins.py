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


def configured_plugins() -> str:
    """The ``cli_plugins`` setting, read as :class:`infra.settings.Settings` reads it
    (``TRIBUTARY_CLI_PLUGINS``, then the TOML file, then the default) without loading the
    settings' machinery: every command, ``--help`` included, builds the CLI first."""
    import os
    import tomllib

    from infra.settings_file import config_file

    value = os.environ.get("TRIBUTARY_CLI_PLUGINS")
    if value is not None:
        return value
    path = config_file()
    if path.is_file():
        try:
            from_file = tomllib.loads(path.read_text()).get("cli_plugins")
        except (OSError, ValueError):
            from_file = None  # the commands that load the settings say what is wrong
        if isinstance(from_file, str):
            return from_file
    return DEFAULT_CLI_PLUGINS


def add_cli_plugins(app: typer.Typer) -> None:
    """Add the Typer apps the ``cli_plugins`` setting names (``module:app``, comma-separated)
    to the CLI; a plug-in that cannot be loaded is left out (the commands that need the
    settings say what is wrong with them)."""
    for spec in (s.strip() for s in configured_plugins().split(",")):
        if not spec:
            continue
        try:
            plugin, _ = load_named(spec, "CLI plug-in", "TRIBUTARY_CLI_PLUGINS", "app")
        except TributaryError:
            continue
        if isinstance(plugin, typer.Typer):
            app.add_typer(plugin)
