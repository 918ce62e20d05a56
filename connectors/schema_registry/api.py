"""The registry's REST API: the subset of Confluent Schema Registry's API that clients use.

Bodies are JSON; requests may use ``application/vnd.schemaregistry.v1+json``,
``application/vnd.schemaregistry+json`` or ``application/json``, and answers carry
``application/vnd.schemaregistry.v1+json``. Every error answers
``{"error_code": <Confluent code>, "message": ...}`` with the code's HTTP status (40401 → 404,
42201 → 422, 409 → 409, 50001 → 500).
"""

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from connectors.schema_registry.client import CONTENT_TYPE
from connectors.schema_registry.errors import InvalidSchemaError, SchemaRegistryError
from connectors.schema_registry.registry import ParsedSchema, SchemaRegistry

log = logging.getLogger(__name__)


class RegistryResponse(Response):
    media_type = CONTENT_TYPE

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


def _error(status: int, code: int, message: str) -> RegistryResponse:
    return RegistryResponse({"error_code": code, "message": message}, status_code=status)


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise SchemaRegistryError(f"Unrecognized request body: not JSON ({exc})", 400) from exc
    if not isinstance(body, dict):
        raise SchemaRegistryError("Unrecognized request body: expected a JSON object", 400)
    return body


async def _schema(request: Request) -> ParsedSchema:
    body = await _body(request)
    text = body.get("schema")
    if not isinstance(text, str):
        raise InvalidSchemaError('Invalid schema: the body needs a "schema" string')
    return ParsedSchema(text, body.get("schemaType"), body.get("references") or [])


def _flag(value: str | None) -> bool:
    """Query flags as clients send them: ``true``, ``True``, ``1``."""
    return value is not None and value.strip().lower() in ("true", "1", "yes")


def create_registry_app(registry: SchemaRegistry) -> FastAPI:
    """The ASGI app serving ``registry``."""
    app = FastAPI(
        title="Tributary schema registry",
        description="Confluent Schema Registry REST API (Avro subset) over a compacted topic.",
        default_response_class=RegistryResponse,
    )

    async def registry_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, SchemaRegistryError)
        return _error(exc.http_status, exc.error_code, exc.message)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return _error(exc.status_code, exc.status_code, f"HTTP {exc.status_code} {exc.detail}")

    async def invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        reasons = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()
        )
        return _error(422, 422, f"Unprocessable request: {reasons}")

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("schema registry request failed")
        return _error(500, 50001, f"Error in the backend data store: {exc}")

    app.add_exception_handler(SchemaRegistryError, registry_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(Exception, unexpected)

    @app.get("/")
    def root() -> dict[str, Any]:
        return {}

    @app.get("/schemas/types")
    def schema_types() -> list[str]:
        return ["AVRO"]

    @app.get("/subjects")
    def subjects(deleted: str | None = None) -> list[str]:
        return registry.subject_names(_flag(deleted))

    @app.get("/subjects/{subject}/versions")
    def versions(subject: str, deleted: str | None = None) -> list[int]:
        return registry.version_numbers(subject, _flag(deleted))

    @app.get("/subjects/{subject}/versions/{version}")
    def version(subject: str, version: str, deleted: str | None = None) -> dict[str, Any]:
        return registry.get_version(subject, version, _flag(deleted)).as_dict()

    @app.get("/subjects/{subject}/versions/{version}/schema")
    def version_schema(subject: str, version: str, deleted: str | None = None) -> Response:
        entry = registry.get_version(subject, version, _flag(deleted))
        return Response(entry.schema, media_type=CONTENT_TYPE)

    @app.post("/subjects/{subject}/versions")
    async def register(request: Request, subject: str, normalize: str | None = None) -> Any:
        schema = await _schema(request)
        schema_id = await run_in_threadpool(registry.register, subject, schema, _flag(normalize))
        return {"id": schema_id}

    @app.post("/subjects/{subject}")
    async def lookup(
        request: Request, subject: str, normalize: str | None = None, deleted: str | None = None
    ) -> dict[str, Any]:
        schema = await _schema(request)
        return registry.lookup(subject, schema, _flag(normalize), _flag(deleted)).as_dict()

    @app.delete("/subjects/{subject}")
    def delete_subject(subject: str, permanent: str | None = None) -> list[int]:
        return registry.delete_subject(subject, _flag(permanent))

    @app.delete("/subjects/{subject}/versions/{version}")
    def delete_version(subject: str, version: str, permanent: str | None = None) -> int:
        return registry.delete_version(subject, version, _flag(permanent))

    @app.get("/schemas/ids/{schema_id}")
    def schema_by_id(schema_id: int) -> dict[str, Any]:
        entry = registry.schema_by_id(schema_id)
        out = entry.as_dict()
        return {k: out[k] for k in ("schema", "schemaType", "references") if k in out}

    @app.get("/schemas/ids/{schema_id}/schema")
    def raw_schema_by_id(schema_id: int) -> Response:
        return Response(registry.schema_by_id(schema_id).schema, media_type=CONTENT_TYPE)

    @app.get("/schemas/ids/{schema_id}/versions")
    def versions_of_id(schema_id: int, deleted: str | None = None) -> list[dict[str, Any]]:
        return [
            {"subject": e.subject, "version": e.version}
            for e in registry.versions_of_id(schema_id, _flag(deleted))
        ]

    @app.get("/schemas/ids/{schema_id}/subjects")
    def subjects_of_id(schema_id: int, deleted: str | None = None) -> list[str]:
        found = registry.versions_of_id(schema_id, _flag(deleted))
        return sorted({e.subject for e in found})

    @app.post("/compatibility/subjects/{subject}/versions/{version}")
    async def compatibility(
        request: Request, subject: str, version: str, verbose: str | None = None
    ) -> dict[str, Any]:
        schema = await _schema(request)
        return _compatibility(registry.test_compatibility(subject, schema, version), verbose)

    @app.post("/compatibility/subjects/{subject}/versions")
    async def compatibility_all(
        request: Request, subject: str, verbose: str | None = None
    ) -> dict[str, Any]:
        schema = await _schema(request)
        return _compatibility(registry.test_compatibility(subject, schema, None), verbose)

    @app.get("/config")
    def global_config() -> dict[str, Any]:
        return {"compatibilityLevel": registry.level()}

    @app.put("/config")
    async def set_global_config(request: Request) -> dict[str, Any]:
        level = _level_of(await _body(request))
        return {"compatibility": registry.set_level(level)}

    @app.delete("/config")
    def delete_global_config() -> dict[str, Any]:
        return {"compatibilityLevel": registry.delete_level()}

    @app.get("/config/{subject}")
    def subject_config(subject: str, defaultToGlobal: str | None = None) -> dict[str, Any]:
        return {"compatibilityLevel": registry.subject_level(subject, _flag(defaultToGlobal))}

    @app.put("/config/{subject}")
    async def set_subject_config(request: Request, subject: str) -> dict[str, Any]:
        level = _level_of(await _body(request))
        return {"compatibility": registry.set_level(level, subject)}

    @app.delete("/config/{subject}")
    def delete_subject_config(subject: str) -> dict[str, Any]:
        return {"compatibilityLevel": registry.delete_level(subject)}

    @app.get("/mode")
    def mode() -> dict[str, Any]:
        return {"mode": "READWRITE"}

    return app


def _level_of(body: dict[str, Any]) -> str:
    level = body.get("compatibility", body.get("compatibilityLevel"))
    return str(level or "")


def _compatibility(messages: list[str], verbose: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"is_compatible": not messages}
    if _flag(verbose):
        out["messages"] = messages
    return out
