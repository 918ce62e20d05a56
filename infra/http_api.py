"""The HTTP API: commands in, the views' queries out (``tributary serve``).

- ``POST /commands`` takes the ``commands`` topic's envelope (``command_id`` optional) and runs
  the command through the same :class:`~event_store.CommandBus` as the command processor;
  ``wait_views=true`` then waits until the views applied the result's position token.
- one ``GET`` route per query the configured views declare (:class:`projections.view.Query`),
  typed and range-checked from its :class:`~projections.view.QueryParam`; ``min_position``
  waits for a position token before the query runs.
- ``GET /health``: the database and every view's store.
- ``GET /metrics``: each view's last batch id and its own counters (e.g. an analytics job's
  late events) in Prometheus' text format.

Who may do what: with ``TRIBUTARY_API_TOKEN`` set, ``POST /commands`` needs
``Authorization: Bearer <token>``; with ``TRIBUTARY_API_READ_TOKEN`` set, so do the query routes
(the read token, or the command token). ``/health``, ``/metrics`` and ``/docs`` stay open. A
missing token is 401 (with ``WWW-Authenticate: Bearer``), a wrong one 403.

Every error answers JSON ``{"error": reason}``: 422 for a request that does not fit (bad JSON,
an unknown command type, a parameter out of range), 400 for what a query refused, 404 for what
it did not find, 503 when a store or the database cannot be reached (never a wrong answer), 504
when the views did not catch up with a token in time. Reasons never carry a password or token
(:func:`tributary.redact.redact`).
"""

import asyncio
import hmac
import inspect
import json
import sys
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Request
from fastapi import Query as QueryField
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.params import Depends as DependsParam
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from sqlalchemy import Engine, text
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from event_store import CommandBus, CommandRegistry, Rejected
from event_store.command import CommandResult
from event_store.command_topic import MAX_COMMAND_ID_CHARS, CommandEnvelope, parse_envelope
from event_store.errors import (
    CommandDecodeError,
    ConcurrencyError,
    EventStoreError,
    MalformedCommandError,
    StorageError,
    UnknownCommandTypeError,
)
from infra.settings import Settings
from infra.view_queries import (
    MIN_POSITION,
    TIMEOUT,
    UNAVAILABLE,
    LazyWaiter,
    QueryFailure,
    ViewQuery,
    Waiter,
    bounded,
    declared_queries,
    default_waiter,
    failure_of,
    is_required,
    lagging_views,
    reason_of,
    run_query,
    unavailable,
    with_defaults,
)
from projections.view import QueryParam, View
from tributary.redact import install_log_redaction, redact, redact_data, register_secret

MAX_TIMEOUT_S = 300.0

_STATUS = {"lagging": 504, "unavailable": 503, "not_found": 404, "invalid": 400}


class ErrorBody(BaseModel):
    """Every error: what went wrong and, where it helps, what to do."""

    error: str


class LaggingBody(ErrorBody):
    """The views named in ``lagging`` did not apply the position token in time."""

    lagging: list[str]


class HealthBody(BaseModel):
    """``ok`` when the database and every view store answer, else ``unavailable``."""

    status: str
    checks: dict[str, dict[str, Any]]
    error: str | None = None


def error(
    status: int, reason: str, headers: Mapping[str, str] | None = None, **extra: Any
) -> JSONResponse:
    body = redact_data({"error": bounded(reason), **jsonable_encoder(extra)})
    return JSONResponse(body, status_code=status, headers=headers)


def failure_response(failure: QueryFailure, **extra: Any) -> JSONResponse:
    if failure.kind == "lagging":
        extra = {"lagging": list(failure.lagging), **extra}
    return error(_STATUS[failure.kind], failure.reason, **extra)


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorBody, "description": "A parameter is missing, mistyped or out of range."},
    503: {"model": ErrorBody, "description": "A store or the database cannot be reached."},
}
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "No bearer token (Authorization: Bearer <token>)."},
    403: {"model": ErrorBody, "description": "The bearer token is not valid here."},
}
QUERY_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "The query refused the arguments, or the token."},
    404: {"model": ErrorBody, "description": "The query found nothing."},
    **ERROR_RESPONSES,
    504: {"model": LaggingBody, "description": "The views did not apply min_position in time."},
}


# -- who may do what ---------------------------------------------------------------------


def bearer_guard(
    scheme_name: str, description: str, tokens: Sequence[str], what: str
) -> DependsParam:
    """A route dependency that requires ``Authorization: Bearer`` with one of ``tokens``
    (401 with ``WWW-Authenticate: Bearer`` when missing, 403 when wrong); FastAPI declares it
    in the OpenAPI schema as the bearer security scheme ``scheme_name``."""
    scheme = HTTPBearer(auto_error=False, scheme_name=scheme_name, description=description)
    expected = [token.encode() for token in tokens]

    async def guard(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(scheme)],
    ) -> None:
        if credentials is None:
            raise HTTPException(
                401,
                f"{what} need a bearer token: send the header Authorization: Bearer <token>",
                headers={"WWW-Authenticate": "Bearer"},
            )
        given = credentials.credentials.encode()
        valid = False
        for token in expected:  # compare with every token: the time says nothing
            valid |= hmac.compare_digest(given, token)
        if not valid:
            raise HTTPException(403, f"the bearer token is not valid for {what}")

    return DependsParam(guard)


def command_guard(settings: Settings) -> DependsParam | None:
    """What ``POST /commands`` requires (None: open)."""
    if settings.api_token is None:
        return None
    return bearer_guard(
        "commandToken",
        "TRIBUTARY_API_TOKEN: required by POST /commands (also reads the queries).",
        [settings.api_token.get_secret_value()],
        "commands",
    )


def read_guard(settings: Settings) -> DependsParam | None:
    """What the query routes require (None: open): the read token or the command token."""
    if settings.api_read_token is None:
        return None
    tokens = [settings.api_read_token.get_secret_value()]
    if settings.api_token is not None:
        tokens.append(settings.api_token.get_secret_value())
    return bearer_guard(
        "readToken",
        "TRIBUTARY_API_READ_TOKEN (or the command token): required by the query routes.",
        tokens,
        "view queries",
    )


# -- commands ----------------------------------------------------------------------------


class CommandGateway:
    """Runs commands through the bus; the database is prepared (schema, the domain's tables)
    on the first command, as the processor does, and again after a failure."""

    def __init__(self, settings: Settings, bus: CommandBus | None) -> None:
        self._prepare: Callable[[], None] | None = None
        if bus is None:
            from connectors.postgres import make_engine
            from infra.commands import (
                command_bus,
                load_registry,
                prepare_database,
                register_schemas,
            )

            registry, module = load_registry(settings.command_handlers)
            engine = make_engine(settings.postgres())
            bus = command_bus(settings, engine, registry)

            def prepare() -> None:
                register_schemas(settings, registry)
                prepare_database(settings, engine, module)

            self._prepare = prepare
        self.bus = bus
        self._lock = threading.Lock()

    @property
    def registry(self) -> CommandRegistry:
        return self.bus.registry

    @property
    def engine(self) -> Engine:
        return self.bus.store.engine

    def handle(self, envelope: CommandEnvelope) -> CommandResult:
        """The command's result; raises the registry's decode errors for a command that does
        not fit its type, and the database's errors when it fails."""
        command = self.registry.decode(envelope.type, envelope.data)
        with self._lock:
            if self._prepare is not None:
                self._prepare()
                self._prepare = None
        # Data the database refuses (a NUL character, an integer beyond bigint) and a
        # handler's exception come back from the bus as the command's recorded rejection,
        # as the processor answers them (event_store.faults); a StorageError is the
        # database failing (503).
        try:
            return self.bus.send(command, envelope.command_id)
        except ConcurrencyError as exc:
            return Rejected(envelope.command_id, f"gave up after retries: {exc}")
        except StorageError:
            raise
        except EventStoreError as exc:  # as the processor answers it
            return Rejected(envelope.command_id, str(exc))


def read_envelope(body: bytes) -> CommandEnvelope:
    """The request body as a command envelope (a new ``command_id`` when it has none)."""
    try:
        return _read_envelope(body)
    except RecursionError as exc:
        raise MalformedCommandError("the body nests arrays or objects too deeply") from exc


def _read_envelope(body: bytes) -> CommandEnvelope:
    try:
        parsed = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedCommandError(f"the body is not JSON: {exc}") from exc
    except ValueError as exc:  # json reads integers of at most sys.get_int_max_str_digits()
        raise MalformedCommandError(
            f"the body holds an integer of more than {sys.get_int_max_str_digits()} digits"
        ) from exc
    if not isinstance(parsed, dict):
        raise MalformedCommandError(
            'the body must be a JSON object {"type": ..., "data": {...}, "command_id": ...}'
        )
    if parsed.get("command_id") is None:
        parsed["command_id"] = str(uuid.uuid4())
    if "type" not in parsed:
        raise MalformedCommandError("type is missing (the command type, e.g. CreatePost)")
    if "data" not in parsed:
        raise MalformedCommandError("data is missing (the command's fields as a JSON object)")
    try:
        # JSON's \u escapes can spell lone UTF-16 surrogates, which are not text: neither
        # UTF-8 nor PostgreSQL can hold them
        envelope = json.dumps(parsed, ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end].encode("unicode_escape").decode()
        raise MalformedCommandError(
            f"the body holds a lone surrogate ({bad}): strings must be Unicode text"
        ) from exc
    return parse_envelope(envelope)


def envelope_schema(registry: CommandRegistry) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["type", "data"],
        "additionalProperties": False,
        "properties": {
            "command_id": {
                "type": ["string", "null"],
                "minLength": 1,
                "maxLength": MAX_COMMAND_ID_CHARS,
                "description": "Idempotency key, not blank: the same id again returns the first"
                " result and appends nothing (absent or null: a new UUID).",
            },
            "type": {"type": "string", "enum": registry.names(), "description": "Command type."},
            "data": {"type": "object", "description": "The command's fields."},
        },
    }


# -- the app -----------------------------------------------------------------------------


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


def create_app(
    settings: Settings,
    *,
    views: Sequence[View] | Mapping[str, View] | None = None,
    bus: CommandBus | None = None,
    waiter: Waiter | None = None,
) -> FastAPI:
    """The API over ``views`` (default: the configured views), running commands through
    ``bus`` (default: built from the settings like the processor's) and waiting for tokens
    with ``waiter`` (default: ``spark_streaming.read_your_writes.ViewWaiter``, loaded on the
    first wait). Raises :class:`~tributary.errors.TributaryError` when the views or the
    command handlers cannot be loaded, or the views' queries cannot be served together."""
    if views is None:
        from infra.views import views_config
        from spark_streaming.views import configured_views

        views = configured_views(views_config(settings))
    install_log_redaction()
    register_secret(*settings.secret_values())  # also when built without validation
    view_list = list(views.values()) if isinstance(views, Mapping) else list(views)
    if waiter is None:
        waiter = LazyWaiter(lambda: default_waiter(view_list, settings))
    api = Api(
        settings,
        view_list,
        declared_queries(view_list),
        CommandGateway(settings, bus),
        waiter,
        command_guard(settings),
        read_guard(settings),
    )
    app = FastAPI(
        title="Tributary",
        version="0.1.0",
        description="Commands in (the event store's command bus), views out (their queries).",
    )
    install_error_handlers(app)
    add_command_route(app, api)
    add_health_route(app, api)
    add_metrics_route(app, api)
    for entry in api.queries.values():
        add_query_route(app, api, entry)
    return app


def install_error_handlers(app: FastAPI) -> None:
    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error(422, validation_reason(exc))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        reason = str(exc.detail)
        if exc.status_code in (404, 405):
            reason = f"{reason}: {request.method} {request.url.path} (the routes are at /docs)"
        return error(exc.status_code, reason, headers=exc.headers)

    async def store_down(request: Request, exc: Exception) -> JSONResponse:
        return error(503, reason_of(exc))

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        return error(500, f"internal error ({type(exc).__name__}): {reason_of(exc)}")

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    for kind in UNAVAILABLE:
        app.add_exception_handler(kind, store_down)
    app.add_exception_handler(Exception, unexpected)  # a bug: still JSON


def validation_reason(exc: RequestValidationError) -> str:
    """``limit (query): Input should be less than or equal to 100, got '500'; ...``"""
    reasons = []
    for problem in exc.errors():
        loc = [str(part) for part in problem.get("loc", ())]
        where = f"{loc[-1]} ({loc[0]})" if len(loc) >= 2 else ".".join(loc) or "request"
        reason = f"{where}: {problem.get('msg', 'invalid')}"
        if "input" in problem and problem["input"] is not None:
            reason += f", got {problem['input']!r}"
        reasons.append(reason)
    return "; ".join(reasons) or "invalid request"


def add_command_route(app: FastAPI, api: Api) -> None:
    async def post_command(
        request: Request,
        wait_views: Annotated[
            bool,
            QueryField(description="Wait until every view applied the command's position token."),
        ] = False,
        timeout: Annotated[
            float, QueryField(ge=0, le=MAX_TIMEOUT_S, description="Seconds to wait for views.")
        ] = 10.0,
    ) -> JSONResponse:
        try:
            envelope = read_envelope(await request.body())
        except MalformedCommandError as exc:
            return error(422, exc.reason)
        try:
            result = await run_in_threadpool(api.commands.handle, envelope)
        except (UnknownCommandTypeError, CommandDecodeError) as exc:
            return error(422, str(exc))
        except Exception as exc:
            if unavailable(exc):
                return error(503, f"the command was not handled: {reason_of(exc)}")
            raise
        body = result.to_json()
        if isinstance(body.get("reason"), str):  # a rejection may quote a driver's error
            body["reason"] = redact(bounded(body["reason"]))
        token = body.get("position_token")
        if wait_views and body.get("status") == "accepted" and isinstance(token, str):
            try:
                await run_in_threadpool(api.waiter.wait, token, timeout)
            except Exception as exc:
                lagging = lagging_views(exc)
                if lagging is not None:
                    return error(504, reason_of(exc), lagging=list(lagging), result=body)
                if unavailable(exc):
                    return error(503, reason_of(exc), result=body)
                raise
        return JSONResponse(jsonable_encoder(body))

    app.add_api_route(
        "/commands",
        post_command,
        methods=["POST"],
        summary="Run a command",
        description=(
            "Runs the command through the command bus (the processor's: same handlers, "
            "snapshots and retries) and answers its result: 200 with status `accepted` or "
            "`rejected` (nothing stored; also for data the database cannot store, a NUL "
            "character or an integer beyond bigint, and for a handler that failed), 422 for "
            "a malformed envelope, an unknown command type or data the type cannot decode, "
            "503 when the database fails. With "
            "`wait_views=true` it answers once every view applied the result's "
            "`position_token` (504 naming the lagging views, with the result, if not in time)."
        ),
        tags=["commands"],
        dependencies=[] if api.command_guard is None else [api.command_guard],
        responses={
            200: {"description": "The command's result (`status` says which)."},
            **({} if api.command_guard is None else AUTH_RESPONSES),
            **ERROR_RESPONSES,
            504: {"model": LaggingBody, "description": "Accepted, but views lag (see result)."},
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": envelope_schema(api.commands.registry)}},
            }
        },
    )


def add_health_route(app: FastAPI, api: Api) -> None:
    def database() -> dict[str, Any]:
        with api.commands.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return {"status": "ok"}

    def view_store(view: View) -> Callable[[], dict[str, Any]]:
        def check() -> dict[str, Any]:
            store = view.store
            generation = store.live_generation()
            commit = store.committed(generation)
            return {
                "status": "ok",
                "store": store.kind,
                "generation": generation,
                "batch_id": commit.batch_id,
                "batches": commit.batches,
            }

        return check

    def guarded(check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            return check()
        except Exception as exc:  # a failing check is an answer, not an error
            return {"status": "error", "error": reason_of(exc)}

    async def health() -> JSONResponse:
        named = {"database": database} | {f"view:{v.name}": view_store(v) for v in api.views}
        results = await asyncio.gather(
            *(run_in_threadpool(guarded, check) for check in named.values())
        )
        checks = dict(zip(named, results, strict=True))
        failing = [name for name, check in checks.items() if check["status"] != "ok"]
        if failing:
            reason = f"failing checks: {', '.join(failing)}"
            return JSONResponse(
                redact_data({"status": "unavailable", "error": reason, "checks": checks}),
                status_code=503,
            )
        return JSONResponse({"status": "ok", "checks": checks})

    app.add_api_route(
        "/health",
        health,
        methods=["GET"],
        summary="Health of the database and every view store",
        description="200 when the database and each view's store answer (with each view's live "
        "generation and last batch), else 503 naming the failing checks.",
        tags=["health"],
        response_model=HealthBody,
        responses={503: {"model": HealthBody, "description": "A check failed."}},
    )


PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def metric_lines(views: Sequence[View]) -> list[str]:
    """Prometheus text lines: ``tributary_view_up`` (1 when the store answered), the last
    ``tributary_view_batch_id`` and each of the view's own counters as
    ``tributary_view_<counter>``, labelled by view."""
    samples: dict[str, list[str]] = {"up": [], "batch_id": []}
    for view in views:
        label = '{view="' + view.name.replace("\\", "\\\\").replace('"', '\\"') + '"}'
        try:
            commit = view.store.committed(view.store.live_generation())
            counters = view.metrics() if view.metrics is not None else {}
        except Exception:  # a store that does not answer is a sample, not an error
            samples["up"].append(f"tributary_view_up{label} 0")
            continue
        samples["up"].append(f"tributary_view_up{label} 1")
        samples["batch_id"].append(f"tributary_view_batch_id{label} {commit.batch_id}")
        for name, value in counters.items():
            samples.setdefault(name, []).append(f"tributary_view_{name}{label} {value}")
    lines = []
    for name, values in samples.items():
        kind = "counter" if name not in ("up", "batch_id") else "gauge"
        lines += [f"# TYPE tributary_view_{name} {kind}", *values]
    return lines


def add_metrics_route(app: FastAPI, api: Api) -> None:
    async def metrics() -> PlainTextResponse:
        lines = await run_in_threadpool(metric_lines, api.views)
        return PlainTextResponse("\n".join(lines) + "\n", media_type=PROMETHEUS_TEXT)

    app.add_api_route(
        "/metrics",
        metrics,
        methods=["GET"],
        summary="Metrics of every view (Prometheus text format)",
        description="tributary_view_up, tributary_view_batch_id and each view's own counters"
        " (e.g. tributary_view_late_events of the analytics jobs), labelled by view.",
        tags=["health"],
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {}}, "description": "The samples."}},
    )


def _annotation(param: QueryParam) -> Any:
    bounds: dict[str, Any] = {}
    if param.kind is int:
        bounds = {"ge": param.minimum, "le": param.maximum}
    else:
        bounds = {"min_length": param.minimum, "max_length": param.maximum}
    bounds = {k: v for k, v in bounds.items() if v is not None}
    field = Path if param.where == "path" else QueryField
    kind: Any = param.kind if is_required(param) or param.default is not None else param.kind | None
    return Annotated[kind, field(description=param.description or None, **bounds)]


def query_signature(entry: ViewQuery) -> inspect.Signature:
    """The route's parameters as FastAPI reads them: the query's, then min_position and
    timeout."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = []
    for param in entry.params:
        default = inspect.Parameter.empty if is_required(param) else param.default
        params.append(
            inspect.Parameter(param.name, keyword, default=default, annotation=_annotation(param))
        )
    min_position = Annotated[
        str | None,
        QueryField(
            description="A position token (from a command's result): answer only once the "
            "views applied it."
        ),
    ]
    timeout = Annotated[
        float,
        QueryField(ge=0, le=MAX_TIMEOUT_S, description="Seconds to wait for min_position."),
    ]
    params.append(inspect.Parameter(MIN_POSITION, keyword, default=None, annotation=min_position))
    params.append(inspect.Parameter(TIMEOUT, keyword, default=10.0, annotation=timeout))
    return inspect.Signature(params)


def add_query_route(app: FastAPI, api: Api, entry: ViewQuery) -> None:
    def endpoint(**values: Any) -> JSONResponse:
        min_position = values.pop(MIN_POSITION, None)
        timeout = float(values.pop(TIMEOUT, 10.0))
        try:
            result = run_query(
                entry, with_defaults(entry, values), api.waiter, min_position, timeout
            )
        except Exception as exc:
            failure = failure_of(exc)
            if failure is None:
                raise
            return failure_response(failure)
        return JSONResponse(jsonable_encoder(result))

    endpoint.__signature__ = query_signature(entry)  # type: ignore[attr-defined]
    endpoint.__name__ = f"query_{entry.name}"
    description = entry.query.description.strip() or entry.summary
    app.add_api_route(
        entry.query.path,
        endpoint,
        methods=["GET"],
        name=entry.name,
        operation_id=f"query_{entry.name}",
        summary=entry.summary,
        description=f"{description}\n\nView `{entry.view.name}` ({entry.view.store.kind}); "
        f"`tributary query {entry.name}` runs the same query.",
        tags=[f"view {entry.view.name}"],
        dependencies=[] if api.read_guard is None else [api.read_guard],
        responses=QUERY_RESPONSES
        if api.read_guard is None
        else {**AUTH_RESPONSES, **QUERY_RESPONSES},
    )
