"""``GET /health``: 200 when the database and every view's store answer (each view's live
generation and last batch), else 503 naming the failing checks."""

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from infra.http_api.api import Api
from infra.view_queries import reason_of
from projections.view import View
from tributary.redact import redact_data


class HealthBody(BaseModel):
    """``ok`` when the database and every view store answer, else ``unavailable``."""

    status: str
    checks: dict[str, dict[str, Any]]
    error: str | None = None


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
