"""``POST /commands``: the ``commands`` topic's envelope in, run through the same command bus
as the command processor; ``wait_views=true`` then waits for the result's position token."""

import json
import sys
import uuid
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi import Query as QueryField
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from event_store import CommandRegistry
from event_store.command_topic import MAX_COMMAND_ID_CHARS, CommandEnvelope, parse_envelope
from event_store.errors import (
    CommandDecodeError,
    MalformedCommandError,
    UnknownCommandTypeError,
)
from infra.http_api.api import Api
from infra.http_api.errors import (
    AUTH_RESPONSES,
    ERROR_RESPONSES,
    MAX_TIMEOUT_S,
    LaggingBody,
    error,
)
from infra.view_queries import bounded, lagging_views, reason_of, unavailable
from tributary.redact import redact


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
