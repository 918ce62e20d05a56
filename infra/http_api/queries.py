"""One ``GET`` route per query the configured views declare (:class:`projections.view.Query`):
its path and query-string parameters typed and range-checked from its
:class:`~projections.view.QueryParam` (two pydantic models per query, which FastAPI reads as
the route's path and query parameters); ``min_position`` waits for a position token before the
query runs."""

from typing import Annotated, Any, cast

from fastapi import FastAPI
from fastapi import Path as PathField
from fastapi import Query as QueryField
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, create_model

from infra.http_api.api import Api
from infra.http_api.errors import AUTH_RESPONSES, MAX_TIMEOUT_S, QUERY_RESPONSES, failure_response
from infra.view_queries import (
    MIN_POSITION,
    TIMEOUT,
    ViewQuery,
    failure_of,
    is_required,
    run_query,
    with_defaults,
)
from projections.view import QueryParam

__all__ = ["add_query_route", "parameter_models"]


def _field(param: QueryParam) -> tuple[Any, Any]:
    """The pydantic field of one parameter: its type, default and bounds."""
    bounds: dict[str, Any]
    if param.kind is int:
        bounds = {"ge": param.minimum, "le": param.maximum}
    else:
        bounds = {"min_length": param.minimum, "max_length": param.maximum}
    bounds = {k: v for k, v in bounds.items() if v is not None}
    required = is_required(param)
    kind: Any = param.kind if required or param.default is not None else param.kind | None
    default = ... if required else param.default
    return kind, Field(default, description=param.description or None, **bounds)


def parameter_models(entry: ViewQuery) -> tuple[type[BaseModel], type[BaseModel]]:
    """The route's path parameters and its query-string parameters (the query's own, then
    ``min_position`` and ``timeout``), as two models."""
    path: dict[str, Any] = {p.name: _field(p) for p in entry.params if p.where == "path"}
    query: dict[str, Any] = {p.name: _field(p) for p in entry.params if p.where != "path"}
    query[MIN_POSITION] = (
        str | None,
        Field(
            None,
            description="A position token (from a command's result): answer only once the "
            "views applied it.",
        ),
    )
    query[TIMEOUT] = (
        float,
        Field(10.0, ge=0, le=MAX_TIMEOUT_S, description="Seconds to wait for min_position."),
    )
    name = "".join(part.title() for part in entry.name.split("_"))
    return (
        create_model(f"{name}PathParameters", **path),
        create_model(f"{name}QueryParameters", **query),
    )


def add_query_route(app: FastAPI, api: Api, entry: ViewQuery) -> None:
    PathParameters, QueryParameters = parameter_models(entry)

    def endpoint(
        path: Annotated[PathParameters, PathField()],  # type: ignore[valid-type]
        query: Annotated[QueryParameters, QueryField()],  # type: ignore[valid-type]
    ) -> JSONResponse:
        values = {**cast(BaseModel, path).model_dump(), **cast(BaseModel, query).model_dump()}
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
