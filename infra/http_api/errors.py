"""Every error the API answers: JSON ``{"error": reason}`` (secrets masked), the status of
each kind of failure, and the handlers that turn FastAPI's and the stores' errors into it."""

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from infra.view_queries import QueryFailure, bounded, reason_of, unavailable_errors
from tributary.redact import redact_data

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
    for kind in unavailable_errors():
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
