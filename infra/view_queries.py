"""The queries the configured views declare, as services reach them: by name (``tributary
query``) or by path (``tributary serve``), with their arguments checked, an optional wait for a
position token first, and the failures a reader must tell apart.

A failure is never turned into an answer: a store that cannot be reached is *unavailable*
(HTTP 503, exit 1), views that did not catch up with a token are *lagging* (504, exit 3), what
``run`` did not find is *not found* (404, exit 1) and what it refused is *invalid* (400, exit 2).
"""

import importlib
import keyword
import re
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from connectors.errors import StoreError
from connectors.schema_registry.errors import RegistryUnavailableError
from event_store.errors import StorageError
from infra.errors import (
    QueryArgumentError,
    QueryDeclarationError,
    ReadYourWritesUnavailableError,
    UnknownQueryError,
)
from projections.view import Query, QueryParam, View
from tributary.redact import redact, registered_secrets

if TYPE_CHECKING:
    from infra.settings import Settings

# Parameters every query route takes besides its own, and paths the HTTP API keeps for itself.
MIN_POSITION = "min_position"
TIMEOUT = "timeout"
RESERVED_PARAMS = frozenset({MIN_POSITION, TIMEOUT})
RESERVED_PATHS = frozenset(
    {
        "/commands",
        "/health",
        "/metrics",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
        "/openapi.json",
    }
)

Value = int | str

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_INTEGER = re.compile(r"[+-]?\d+")


def is_required(param: QueryParam) -> bool:
    """Path parameters are always required; a query-string one when it says so."""
    return param.required or param.where == "path"


def option_name(param: QueryParam) -> str:
    return "--" + param.name.replace("_", "-")


@dataclass(frozen=True)
class ViewQuery:
    """One declared query and the view that declares it."""

    view: View
    query: Query

    @property
    def name(self) -> str:
        return self.query.name

    @property
    def params(self) -> tuple[QueryParam, ...]:
        return self.query.params

    @property
    def summary(self) -> str:
        """The first line of the description (or a generated one)."""
        first = self.query.description.strip().splitlines()[0] if self.query.description else ""
        return first or f"{self.name} (view {self.view.name})"

    def usage(self) -> str:
        words = [f"tributary query {self.name}"]
        words += [p.name.upper() for p in self.params if is_required(p)]
        words += [f"[{p.name.upper()}]" for p in self.params if p.positional and not is_required(p)]
        words += [
            f"[{option_name(p)} {'INT' if p.kind is int else 'TEXT'}]"
            for p in self.params
            if not is_required(p) and not p.positional
        ]
        return " ".join(words)


def declared_queries(views: Iterable[View]) -> dict[str, ViewQuery]:
    """Every query the views declare, by name; refuses declarations that cannot be served."""
    found: dict[str, ViewQuery] = {}
    paths: dict[str, str] = {}
    for view in views:
        for query in view.queries:
            entry = ViewQuery(view, query)
            _check(entry)
            if query.name in found:
                raise QueryDeclarationError(
                    f"query {query.name!r} is declared by views {found[query.name].view.name}"
                    f" and {view.name}: query names must be unique"
                )
            template = _PLACEHOLDER.sub("{}", query.path)
            if template in paths:
                raise QueryDeclarationError(
                    f"queries {paths[template]!r} and {query.name!r} have the same path"
                    f" ({query.path})"
                )
            found[query.name] = entry
            paths[template] = query.name
    return found


def _check(entry: ViewQuery) -> None:
    query, where = entry.query, f"view {entry.view.name}, query {entry.query.name!r}"
    if not query.name or not re.fullmatch(r"[A-Za-z0-9_.-]+", query.name):
        raise QueryDeclarationError(f"{where}: the name must be letters, digits, '_', '.', '-'")
    if not query.path.startswith("/") or query.path in RESERVED_PATHS:
        raise QueryDeclarationError(
            f"{where}: path {query.path!r} must start with '/' and not be one of"
            f" {', '.join(sorted(RESERVED_PATHS))}"
        )
    names = [p.name for p in query.params]
    for param in query.params:
        if not param.name.isidentifier() or keyword.iskeyword(param.name):
            raise QueryDeclarationError(f"{where}: parameter {param.name!r} is not an identifier")
        if param.name in RESERVED_PARAMS:
            raise QueryDeclarationError(
                f"{where}: parameter {param.name!r} is reserved (every query takes"
                f" {', '.join(sorted(RESERVED_PARAMS))})"
            )
        if param.kind not in (int, str):
            raise QueryDeclarationError(f"{where}: parameter {param.name!r} must be int or str")
        if param.default is not None and type(param.default) is not param.kind:
            raise QueryDeclarationError(
                f"{where}: the default of {param.name!r} is not {param.kind.__name__}"
            )
    if len(set(names)) != len(names):
        raise QueryDeclarationError(f"{where}: a parameter is declared twice")
    placeholders = set(_PLACEHOLDER.findall(query.path))
    in_path = {p.name for p in query.params if p.where == "path"}
    if placeholders != in_path:
        raise QueryDeclarationError(
            f"{where}: path {query.path} has placeholders {sorted(placeholders)} but the path"
            f" parameters are {sorted(in_path)}"
        )


def find_query(queries: Mapping[str, ViewQuery], name: str) -> ViewQuery:
    entry = queries.get(name)
    if entry is None:
        known = ", ".join(sorted(queries)) or (
            "none (the configured views declare no queries; set TRIBUTARY_VIEWS to a view"
            " factory, module:function)"
        )
        raise UnknownQueryError(f"no view query called {name!r}; available: {known}")
    return entry


# -- arguments ---------------------------------------------------------------------------


def check_bounds(param: QueryParam, value: Value) -> None:
    """``minimum``/``maximum`` bound an int's value and a str's length."""
    measured, what = (value, "") if isinstance(value, int) else (len(value), " characters")
    if param.minimum is not None and measured < param.minimum:
        raise QueryArgumentError(
            f"{param.name}: must be at least {param.minimum}{what}, got {value!r}"
        )
    if param.maximum is not None and measured > param.maximum:
        raise QueryArgumentError(
            f"{param.name}: must be at most {param.maximum}{what}, got {value!r}"
        )


def convert(param: QueryParam, raw: str) -> Value:
    """A command-line word as the parameter's type, range-checked."""
    value: Value
    if param.kind is int:
        if not _INTEGER.fullmatch(raw.strip()):
            raise QueryArgumentError(f"{param.name}: expected an integer, got {raw!r}")
        value = int(raw)
    else:
        value = raw
    check_bounds(param, value)
    return value


def with_defaults(entry: ViewQuery, values: Mapping[str, Value | None]) -> dict[str, Value]:
    """The keyword arguments of ``run``: the given values, then the declared defaults; a
    parameter with neither is left out (``run``'s own default applies)."""
    out: dict[str, Value] = {}
    for param in entry.params:
        value = values.get(param.name)
        if value is None:
            value = param.default
        if value is not None:
            out[param.name] = value
    return out


def cli_arguments(entry: ViewQuery, args: Sequence[str]) -> dict[str, Value]:
    """``run``'s arguments from command-line words: positional words fill the required
    parameters in declaration order, then the optional ones declared ``positional`` (``query
    ctr kafka`` is ``query ctr --query kafka``); ``--name value`` (or ``--name=value``) any
    parameter."""
    by_option = {p.name.replace("_", "-"): p for p in entry.params}
    given: dict[str, str] = {}
    positional: list[str] = []
    i = 0
    while i < len(args):
        word = args[i]
        if word.startswith("--") and len(word) > 2:
            key, has_value, value = word[2:].partition("=")
            param = by_option.get(key.replace("_", "-"))
            if param is None:
                raise QueryArgumentError(
                    f"query {entry.name} has no parameter --{key}; usage: {entry.usage()}"
                )
            if not has_value:
                if i + 1 >= len(args):
                    raise QueryArgumentError(f"{option_name(param)} needs a value")
                i += 1
                value = args[i]
            if param.name in given:
                raise QueryArgumentError(f"{param.name} is given twice")
            given[param.name] = value
        else:
            positional.append(word)
        i += 1
    open_slots = [p for p in entry.params if is_required(p) and p.name not in given]
    open_slots += [
        p for p in entry.params if p.positional and not is_required(p) and p.name not in given
    ]
    if len(positional) > len(open_slots):
        extra = " ".join(positional[len(open_slots) :])
        raise QueryArgumentError(f"unexpected argument(s) {extra!r}; usage: {entry.usage()}")
    for param, word in zip(open_slots, positional, strict=False):
        given[param.name] = word
    missing = [p.name.upper() for p in entry.params if is_required(p) and p.name not in given]
    if missing:
        raise QueryArgumentError(f"missing {', '.join(missing)}; usage: {entry.usage()}")
    by_name = {p.name: p for p in entry.params}
    return with_defaults(entry, {name: convert(by_name[name], raw) for name, raw in given.items()})


# -- waiting for a position token -------------------------------------------------------


class Waiter(Protocol):
    """Waits until the views applied a position token (``ViewWaiter`` of
    :mod:`views.read_your_writes`): raises an error with ``lagging`` (the views that
    did not catch up) after ``timeout`` seconds, and ``ValueError`` for a malformed token."""

    def wait(self, token: str, timeout: float) -> None: ...


def default_waiter(views: Sequence[View], settings: "Settings") -> Waiter:
    """The views' ``ViewWaiter`` over the event store of the settings."""
    from views.read_your_writes import ViewWaiter

    return ViewWaiter(
        list(views),
        settings.postgres().dsn,
        settings.event_store_schema,
        settings.event_topic_prefix,
    )


class LazyWaiter:
    """Builds the real waiter on the first wait (so serving and querying without a token
    never depend on it); thread-safe."""

    def __init__(self, build: Callable[[], Waiter]) -> None:
        self._build = build
        self._waiter: Waiter | None = None
        self._lock = threading.Lock()

    def wait(self, token: str, timeout: float) -> None:
        with self._lock:
            if self._waiter is None:
                self._waiter = self._build()
            waiter = self._waiter
        waiter.wait(token, timeout)


# -- running -----------------------------------------------------------------------------


def run_query(
    entry: ViewQuery,
    arguments: Mapping[str, Value],
    waiter: Waiter | None = None,
    min_position: str | None = None,
    timeout: float = 10.0,
) -> Any:
    """Wait for ``min_position`` (when given), then run the query."""
    if min_position is not None:
        if waiter is None:
            raise ReadYourWritesUnavailableError("no waiter: cannot wait for a position token")
        waiter.wait(min_position, timeout)
    return entry.query.run(**arguments)


FailureKind = Literal["lagging", "unavailable", "not_found", "invalid"]


@dataclass(frozen=True)
class QueryFailure:
    """Why a query gave no answer, as a reader must be told."""

    kind: FailureKind
    reason: str
    lagging: tuple[str, ...] = ()


def lagging_views(exc: BaseException) -> tuple[str, ...] | None:
    """The views a waiter's error names as lagging (``lagging`` as names or name -> reason),
    or None when ``exc`` is not such an error."""
    lagging = getattr(exc, "lagging", None)
    if isinstance(lagging, Mapping):
        return tuple(str(v) for v in lagging)
    if isinstance(lagging, (tuple, list, set, frozenset)):
        return tuple(str(v) for v in lagging)
    return None


UNAVAILABLE: tuple[type[Exception], ...] = (
    StoreError,
    StorageError,
    ReadYourWritesUnavailableError,
    ConnectionError,
    TimeoutError,
    RegistryUnavailableError,
)
"""Errors that say a store or the database could not be reached or failed (not the request),
besides the drivers' own (:data:`DRIVER_UNAVAILABLE`)."""

DRIVER_UNAVAILABLE: dict[str, tuple[str, ...]] = {
    "redis": ("ConnectionError", "TimeoutError"),
    "psycopg": ("OperationalError", "InterfaceError"),
    "sqlalchemy.exc": ("OperationalError", "InterfaceError"),
}
"""The drivers' errors that say a store or the database could not be reached (module: names)."""


def driver_errors(*, load: bool = False) -> tuple[type[Exception], ...]:
    """The errors of :data:`DRIVER_UNAVAILABLE`, of the drivers imported so far (an error of a
    driver that was never imported cannot have been raised: a command that did not use it does
    not pay for its import); ``load``: of every driver, importing them."""
    found: list[type[Exception]] = []
    for module_name, names in DRIVER_UNAVAILABLE.items():
        module = sys.modules.get(module_name)
        if module is None and load:
            module = importlib.import_module(module_name)
        if module is not None:
            found += [getattr(module, name) for name in names]
    return tuple(found)


def unavailable_errors() -> tuple[type[Exception], ...]:
    """Every error that says a store or the database could not be reached (the drivers
    imported): what the HTTP API answers 503 for."""
    return UNAVAILABLE + driver_errors(load=True)


def unavailable(exc: BaseException) -> bool:
    return isinstance(exc, UNAVAILABLE + driver_errors())


MAX_REASON_CHARS = 1000


def bounded(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how many were cut: reasons quote what they
    were given (a path, a parameter, a command's fields), which can be huge, and redacting a
    text takes time that grows faster than its length. A registered secret the cut goes
    through is dropped whole (what is left of it could not be recognized any more)."""
    if len(text) <= limit:
        return text
    kept = text[:limit]
    for secret in registered_secrets():
        for size in range(min(len(secret) - 1, len(kept)), 0, -1):
            if kept.endswith(secret[:size]):
                kept = kept[:-size]
                break
    return f"{kept}... ({len(text) - len(kept)} more characters)"


def reason_of(exc: BaseException) -> str:
    """A one-line reason of at most :data:`MAX_REASON_CHARS` (and a note of what was cut): the
    driver's message for SQLAlchemy errors, the text otherwise; passwords and tokens masked
    (drivers can echo a connection string)."""
    sqlalchemy_errors = sys.modules.get("sqlalchemy.exc")  # none raised if never imported
    if (
        sqlalchemy_errors is not None
        and isinstance(exc, sqlalchemy_errors.DBAPIError)
        and exc.orig is not None
    ):
        exc = exc.orig
    if isinstance(exc, LookupError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        text = exc.args[0]  # KeyError's str() would quote it
    else:
        text = str(exc)
    text = redact(bounded(" ".join(text.split())))
    return text or type(exc).__name__


def failure_of(exc: Exception) -> QueryFailure | None:
    """The failure ``exc`` stands for, or None for an unexpected error (a bug)."""
    lagging = lagging_views(exc)
    if lagging is not None:
        return QueryFailure("lagging", reason_of(exc), lagging)
    if unavailable(exc):
        return QueryFailure("unavailable", reason_of(exc))
    if isinstance(exc, LookupError):
        return QueryFailure("not_found", reason_of(exc))
    if isinstance(exc, (ValueError, QueryArgumentError)):
        return QueryFailure("invalid", reason_of(exc))
    return None
