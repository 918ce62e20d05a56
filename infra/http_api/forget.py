"""``POST /forget``: forget a data subject (as `tributary forget`), behind the write token."""

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from event_store.forgetting import SUBJECT_ID, SUBJECT_TYPE
from infra.http_api.api import Api
from infra.http_api.errors import AUTH_RESPONSES, ERROR_RESPONSES, ErrorBody, error
from infra.view_queries import reason_of, unavailable


class ForgetBody(BaseModel):
    subject_type: str = Field(
        min_length=1, max_length=100, pattern=SUBJECT_TYPE, description="e.g. user"
    )
    subject_id: str = Field(min_length=1, max_length=200, pattern=SUBJECT_ID, description="e.g. 42")


STATUS = {"forgotten": 200, "already": 200, "unknown": 404, "pending": 409}


def add_forget_route(app: FastAPI, api: Api) -> None:
    async def post_forget(body: ForgetBody) -> JSONResponse:
        from infra.forgetting import forget_subject

        try:
            result = await run_in_threadpool(
                forget_subject, api.settings, body.subject_type, body.subject_id
            )
        except Exception as exc:
            if unavailable(exc):
                return error(503, f"nothing was forgotten: {reason_of(exc)}")
            raise
        answer, status = result.as_json(), STATUS[result.status]
        if status >= 400:  # every error answer names its reason under "error"
            answer["error"] = result.message
        return JSONResponse(answer, status_code=status)

    app.add_api_route(
        "/forget",
        post_forget,
        methods=["POST"],
        summary="Forget a data subject",
        description=(
            "Destroys the subject's key and appends `SubjectForgotten` (the views purge the"
            " subject within their next micro-batch): 200 `forgotten` (with its position"
            " token) or `already`; 404 for an unknown subject; 409 while the application's"
            " captured tables still hold it (`remaining`, and the `sql` that deletes them)."
        ),
        tags=["commands"],
        dependencies=[] if api.command_guard is None else [api.command_guard],
        responses={
            200: {"description": "Forgotten now or before (`status`)."},
            400: {"model": ErrorBody, "description": "The body is not JSON."},
            404: {"description": "Unknown subject: nothing changed."},
            409: {"description": "The application still holds the subject: nothing changed."},
            **({} if api.command_guard is None else AUTH_RESPONSES),
            **ERROR_RESPONSES,
        },
    )
