"""The HTTP API: commands in, the views' queries out (``tributary serve``).

- ``POST /commands`` takes the ``commands`` topic's envelope (``command_id`` optional) and runs
  the command through the same :class:`~event_store.CommandBus` as the command processor;
  ``wait_views=true`` then waits until the views applied the result's position token.
- one ``GET`` route per query the configured views declare (:class:`projections.view.Query`),
  typed and range-checked from its :class:`~projections.view.QueryParam`; ``min_position``
  waits for a position token before the query runs.
- ``GET /health``: the database and every view's store.

Every error answers JSON ``{"error": reason}``: 422 for a request that does not fit (bad JSON,
an unknown command type, a parameter out of range), 400 for what a query refused, 404 for what
it did not find, 503 when a store or the database cannot be reached (never a wrong answer), 504
when the views did not catch up with a token in time.
"""

import asyncio
import inspect
import json
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import FastAPI, Path, Request
from fastapi import Query as QueryField
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import Engine, text
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from event_store import CommandBus, CommandRegistry, Rejected
from event_store.command import CommandResult
from event_store.command_topic import CommandEnvelope, parse_envelope
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


def error(status: int, reason: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": reason, **extra}, status_code=status)


def failure_response(failure: QueryFailure, **extra: Any) -> JSONResponse:
    if failure.kind == "lagging":
        extra = {"lagging": list(failure.lagging), **extra}
    return error(_STATUS[failure.kind], failure.reason, **extra)


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorBody, "description": "A parameter is missing, mistyped or out of range."},
    503: {"model": ErrorBody, "description": "A store or the database cannot be reached."},
}
QUERY_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "The query refused the arguments, or the token."},
    404: {"model": ErrorBody, "description": "The query found nothing."},
    **ERROR_RESPONSES,
    504: {"model": LaggingBody, "description": "The views did not apply min_position in time."},
}


# -- commands ----------------------------------------------------------------------------


class CommandGateway:
    """Runs commands through the bus; the database is prepared (schema, the domain's tables)
    on the first command, as the processor does, and again after a failure."""

    def __init__(self, settings: Settings, bus: CommandBus | None) -> None:
        self._prepare: Callable[[], None] | None = None
        if bus is None:
            from connectors.postgres import make_engine
            from infra.cli_events import command_bus, load_registry, prepare_database

            registry, module = load_registry(settings.command_handlers)
            engine = make_engine(settings.postgres())
            bus = command_bus(settings, engine, registry)
            self._prepare = lambda: prepare_database(settings, engine, module)
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
        parsed = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedCommandError(f"the body is not JSON: {exc}") from exc
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
    return parse_envelope(json.dumps(parsed).encode())


def envelope_schema(registry: CommandRegistry) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["type", "data"],
        "additionalProperties": False,
        "properties": {
            "command_id": {
                "type": "string",
                "description": "Idempotency key: the same id again returns the first result"
                " and appends nothing (default: a new UUID).",
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
        from infra.cli_views import views_config
        from spark_streaming.views import configured_views

        views = configured_views(views_config(settings))
    view_list = list(views.values()) if isinstance(views, Mapping) else list(views)
    if waiter is None:
        waiter = LazyWaiter(lambda: default_waiter(view_list, settings))
    api = Api(
        settings, view_list, declared_queries(view_list), CommandGateway(settings, bus), waiter
    )
    app = FastAPI(
        title="Tributary",
        version="0.1.0",
        description="Commands in (the event store's command bus), views out (their queries).",
    )
    install_error_handlers(app)
    add_command_route(app, api)
    add_health_route(app, api)
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
        return JSONResponse({"error": reason}, exc.status_code, headers=exc.headers)

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
            "`rejected` (nothing stored), 422 for a malformed envelope, an unknown command "
            "type or data the type cannot decode, 503 when the database fails. With "
            "`wait_views=true` it answers once every view applied the result's "
            "`position_token` (504 naming the lagging views, with the result, if not in time)."
        ),
        tags=["commands"],
        responses={
            200: {"description": "The command's result (`status` says which)."},
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
                {"status": "unavailable", "error": reason, "checks": checks}, status_code=503
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
        responses=QUERY_RESPONSES,
    )
