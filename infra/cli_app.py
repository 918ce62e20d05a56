"""The Typer application and console shared by every CLI module.

Nothing the CLI prints carries a password or token: :func:`fail` and the handler of unexpected
errors mask them (:mod:`tributary.redact`), and so does every log record of the process.

Heavy modules (pydantic's settings, the drivers, Spark) are imported by the commands that use
them, never here or at the top of a command module: ``tributary --help`` and the commands that
talk to a service start in a fraction of a second.
"""

import importlib
import sys
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, cast

import typer
from rich.console import Console
from rich.markup import escape
from typer._click import Context
from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
from typer.core import TyperCommand, TyperGroup, TyperOption, _TyperParameter
from typer.models import CommandFunctionType

from tributary.errors import TributaryError
from tributary.redact import install_log_redaction, redact

if TYPE_CHECKING:
    from pathlib import Path

    from infra.settings import Settings


class _Deferred(type):
    """A class standing in for the class of the same name in ``_module``, imported at first use
    (a call, an attribute, an ``isinstance``)."""

    _module: str

    def _real(cls) -> type:
        real: type = getattr(importlib.import_module(cls._module), cls.__name__)
        return real

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls._real()(*args, **kwargs)

    def __getattr__(cls, name: str) -> Any:
        return getattr(cls._real(), name)

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, cls._real())


def _import_typer_help() -> None:
    """Import typer's help and error formatting (``typer.rich_utils``) without what it uses
    only for ``rich_markup_mode="markdown"`` and for pretty tracebacks: it imports
    ``rich.markdown`` (markdown-it) and ``rich.traceback`` (pygments, attrs) at the top, ~70 ms
    of ``tributary --help``. Their classes stand in until first used; the stand-in modules are
    gone once typer's module has its names, so any other import gets the real ones."""
    if "typer.rich_utils" in sys.modules:
        return
    stand_ins = {}
    for module, name in (("rich.markdown", "Markdown"), ("rich.traceback", "Traceback")):
        if module not in sys.modules:
            stand_in = types.ModuleType(module)
            setattr(stand_in, name, _Deferred(name, (), {"_module": module}))
            stand_ins[module] = stand_in
    sys.modules.update(stand_ins)
    try:
        importlib.import_module("typer.rich_utils")
    finally:
        for module in stand_ins:
            del sys.modules[module]


_import_typer_help()


def _bool_help(option: TyperOption | None) -> TyperOption | None:
    """``--help`` whose value is ``False`` when not given. Typer leaves it ``None`` and coerces
    that ``None`` through a pydantic ``TypeAdapter`` it builds for the purpose: importing typer's
    adapters (and pydantic) and building one cost ~50 ms of every command; a bool is not
    coerced."""
    if option is not None and option.default is None:
        option.default = False
    return option


class FastGroup(TyperGroup):
    """The CLI's groups: ``--help`` as :func:`_bool_help` makes it."""

    def get_help_option(self, ctx: Context) -> TyperOption | None:
        return _bool_help(super().get_help_option(ctx))


@dataclass(frozen=True)
class _PlainParam(RuntimeParam):
    """Typer's coercion of a ``str``, ``int`` or ``float`` parameter without building its
    pydantic ``TypeAdapter`` (pydantic and typer's adapters: ~0.15 s of `tributary command`,
    `query`) when the value already is what the adapter would return unchanged: a string for
    ``str`` (what the command line gives), a number of the exact type within the bounds (a
    default). Any other value (``--timeout 5``, ``--limit abc``) goes through typer's own
    coercion, with its errors."""

    descriptor: TypeDescriptor

    PLAIN = (str, int, float)

    @classmethod
    def applies(cls, descriptor: TypeDescriptor) -> bool:
        return (
            descriptor.annotation in cls.PLAIN
            and descriptor.file_annotation is None
            and descriptor.parameter_info.parser is None
            and not descriptor.is_choice
        )

    def _coerce_value(self, value: Any, param: _TyperParameter, ctx: Context) -> Any:
        info = self.parameter_info
        if type(value) is self.annotation and (
            value.__class__ is str
            or ((info.min is None or value >= info.min) and (info.max is None or value <= info.max))
        ):
            return value
        return build_runtime_param(self.descriptor)._coerce_value(value, param=param, ctx=ctx)


class FastCommand(TyperCommand):
    """The CLI's commands: ``--help`` as :func:`_bool_help` makes it, plain parameters coerced
    as :class:`_PlainParam` does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, _TyperParameter) and _PlainParam.applies(param.type_descriptor):
                descriptor = param.type_descriptor
                param._runtime_param = _PlainParam(
                    descriptor.parameter_info, descriptor.annotation, descriptor
                )

    def get_help_option(self, ctx: Context) -> TyperOption | None:
        return _bool_help(super().get_help_option(ctx))


class FastTyper(typer.Typer):
    """A Typer app (or sub-app) whose group and commands are :class:`FastGroup` and
    :class:`FastCommand`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{"cls": FastGroup, **kwargs})

    def command(
        self, *args: Any, **kwargs: Any
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        return super().command(*args, **{"cls": FastCommand, **kwargs})


class RedactingTyper(FastTyper):
    """A Typer app whose unexpected errors print a traceback with secrets masked (a driver's
    error or a local variable can hold a connection string) and exit 1."""

    #: Every command module and plug-in registered (:func:`infra.cli.whole_app`).
    whole = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        install_log_redaction()
        try:
            # Always run as a group (what typer's own call builds for an app of several
            # commands): `infra.cli.main` registers only the asked command's module, and
            # typer would run an app of one command as that command, taking its name for an
            # argument. Typer's except hook is not needed: every error is handled here.
            return typer.main.get_group(self)(*args, **kwargs)
        except Exception as exc:
            sys.stderr.write(redact("".join(traceback.format_exception(exc))))
            sys.stderr.flush()
            raise SystemExit(1) from None


app = RedactingTyper(
    name="tributary",
    help="Kafka-centric CDC and event sourcing: Debezium, an append-only event store, Spark views.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
console = Console()
err_console = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def settings(light: bool = False) -> "Settings":
    """The settings; exits 1 naming each wrong variable (never quoting a value) when invalid.

    ``light``: for a command that only reads them (``status``, ``views``, ``query``,
    ``command``), loaded without pydantic when :func:`infra.settings_light.light_settings` can
    (the same values, a unit test holds it), which saves ~0.25 s of its start; else, and for
    every error, pydantic's settings."""
    install_log_redaction()
    if light:
        from infra.settings_light import light_settings

        fast = light_settings()
        if fast is not None:
            # The same fields, derived endpoints and config objects as Settings (a unit test
            # compares them); not a pydantic model: no model_copy, model_dump.
            return cast("Settings", fast)
    from pydantic import ValidationError

    from infra.settings import load_settings, settings_problems

    try:
        return load_settings()
    except ValidationError as exc:
        fail(f"invalid settings: {settings_problems(exc)}")


def write_class_archive(
    archive: "Path", setting: str, force: bool, build: Callable[["Path"], float]
) -> None:
    """`spark-archive` and `cdc-archive`: write ``archive`` with ``build`` unless it exists
    (``force``: again), and say its size and time; ``setting`` names where it was set."""
    if archive.is_dir():
        fail(f"{setting} names a folder ({archive}): name a file")
    if archive.is_file() and not force:
        console.print(
            f"{archive} exists ({archive.stat().st_size / 1e6:.0f} MB); --force rewrites it"
        )
        return
    try:
        took = build(archive)
    except TributaryError as exc:
        fail(exc)
    console.print(f"{archive}: {archive.stat().st_size / 1e6:.0f} MB, written in {took:.0f} s")


def fail(exc: TributaryError | str) -> NoReturn:
    """Print the error (which says what to do next), secrets masked, and exit 1."""
    err_console.print(f"[bold red]error:[/] {escape(redact(str(exc)))}", soft_wrap=True)
    raise typer.Exit(code=1)
