"""``GET /ui``: the operators' window, one page (``dashboard.html``: plain HTML, CSS and
JavaScript drawing SVG, nothing to build) that polls ``GET /ui/state`` every two seconds.

``/ui/state`` is :meth:`infra.telemetry.overview.Overview.state`: the stack and the parts
`tributary run` supervises (up, restarts), the connector and its slot's WAL against the
budget, the topics with their ends, each view's position, lag in records and seconds, batch
rate, last batch's time split and dead letters, verify's last result, and the last minutes'
throughput and lag (sampled while the page is open). Like ``/metrics`` and ``/health`` it
needs no token.
"""

from importlib.resources import files
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.concurrency import run_in_threadpool

from infra.http_api.api import Api

__all__ = ["add_dashboard_routes", "dashboard_page"]


def dashboard_page() -> str:
    """The page's HTML (shipped beside this module)."""
    return files("infra.http_api").joinpath("dashboard.html").read_text(encoding="utf-8")


def add_dashboard_routes(app: FastAPI, api: Api) -> None:
    page = dashboard_page()

    async def ui() -> HTMLResponse:
        if api.overview is not None:
            api.overview.watch()
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    async def state() -> JSONResponse:
        overview = api.overview
        if overview is None:
            return JSONResponse({"error": "no overview"}, status_code=503)
        overview.watch()
        body: dict[str, Any] = await run_in_threadpool(overview.state)
        return JSONResponse(body, headers={"Cache-Control": "no-store"})

    app.add_api_route(
        "/ui",
        ui,
        methods=["GET"],
        summary="The operators' dashboard (HTML, live)",
        tags=["health"],
        response_class=HTMLResponse,
        responses={200: {"content": {"text/html": {}}, "description": "The page."}},
    )
    app.add_api_route(
        "/ui/state",
        state,
        methods=["GET"],
        summary="What the dashboard shows, as JSON",
        description="The stack, the parts, the connector and its slot, the topics, each view's"
        " position, lag, batches and dead letters, verify's last result, and the history of"
        " the last minutes.",
        tags=["health"],
        responses={200: {"description": "The state."}, 503: {"description": "No overview."}},
    )
