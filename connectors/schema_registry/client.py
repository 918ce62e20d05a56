"""A small client of any registry speaking Confluent's REST API (ours, Confluent, Karapace...)."""

import json
from typing import Any
from urllib.parse import quote

import httpx

from connectors.schema_registry.errors import RegistryUnavailableError, SchemaRegistryError
from tributary.redact import redact_url

#: The media type of Confluent's REST API: what a client sends and asks for, what a registry
#: answers (defined here, not with the server: a client need not import the web framework).
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class RegistryClient:
    """Calls the registry at ``url``; every error is a :class:`SchemaRegistryError` with the
    registry's ``error_code`` (or the HTTP status when it sent none), and a registry that does
    not answer or answers 5xx a :class:`RegistryUnavailableError` (retry, not the caller's
    fault)."""

    def __init__(self, url: str, timeout: float = 10.0, http: httpx.Client | None = None) -> None:
        self.url = url.rstrip("/")
        self._http = http or httpx.Client(
            base_url=self.url, timeout=timeout, headers={"Accept": CONTENT_TYPE}
        )

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        content = None if body is None else json.dumps(body)
        headers = {} if body is None else {"Content-Type": CONTENT_TYPE}
        try:
            answer = self._http.request(method, path, content=content, headers=headers)
        except httpx.HTTPError as exc:
            raise RegistryUnavailableError(
                f"the schema registry at {redact_url(self.url)} does not answer ({exc}): start"
                " it with `tributary up`, or set TRIBUTARY_SCHEMA_REGISTRY_URL",
            ) from exc
        if answer.is_success:
            return answer.json() if answer.content else None
        try:
            error = answer.json()
            code, message = int(error["error_code"]), str(error["message"])
        except (ValueError, KeyError, TypeError):
            code, message = answer.status_code, answer.text[:200]
        if answer.status_code >= 500:  # the registry's (or a proxy's) fault: try again later
            raise RegistryUnavailableError(
                f"the schema registry at {redact_url(self.url)} answered"
                f" {answer.status_code}: {message}",
                code,
            )
        raise SchemaRegistryError(message, code)

    def subjects(self) -> list[str]:
        return list(self._call("GET", "/subjects"))

    def versions(self, subject: str) -> list[int]:
        return list(self._call("GET", f"/subjects/{quote(subject, safe='')}/versions"))

    def version(self, subject: str, version: int | str = "latest") -> dict[str, Any]:
        return dict(self._call("GET", f"/subjects/{quote(subject, safe='')}/versions/{version}"))

    def register(self, subject: str, schema: str) -> int:
        """Register ``schema`` under ``subject`` (its id; the same id again when it already
        is registered); error 409 when it is incompatible with the subject's versions."""
        path = f"/subjects/{quote(subject, safe='')}/versions"
        return int(self._call("POST", path, {"schema": schema})["id"])

    def schema_text(self, schema_id: int) -> str:
        """The schema with this id, as JSON text (``GET /schemas/ids/{id}``)."""
        return str(self._call("GET", f"/schemas/ids/{int(schema_id)}")["schema"])

    def level(self, subject: str | None = None) -> str:
        if subject is not None:
            try:
                path = f"/config/{quote(subject, safe='')}?defaultToGlobal=true"
                return str(self._call("GET", path)["compatibilityLevel"])
            except SchemaRegistryError as exc:
                if exc.error_code not in (40401, 40408):
                    raise
        return str(self._call("GET", "/config")["compatibilityLevel"])

    def lookup(self, subject: str, schema: str) -> dict[str, Any] | None:
        """The registered version equal to ``schema``, or None."""
        try:
            found = self._call("POST", f"/subjects/{quote(subject, safe='')}", {"schema": schema})
        except SchemaRegistryError as exc:
            if exc.error_code in (40401, 40403):
                return None
            raise
        return dict(found)

    def check(self, subject: str, schema: str) -> list[str]:
        """Why registering ``schema`` under ``subject`` would be refused (empty: it would be
        accepted): checked as registering checks it (every version for transitive levels)."""
        body = {"schema": schema}
        path = f"/compatibility/subjects/{quote(subject, safe='')}/versions"
        try:
            answer = self._call("POST", f"{path}?verbose=true", body)
        except SchemaRegistryError as exc:
            if exc.error_code != 404:  # a registry without the all-versions route
                raise
            try:
                answer = self._call("POST", f"{path}/latest?verbose=true", body)
            except SchemaRegistryError as missing:
                if missing.error_code == 40401:
                    return []
                raise
        if answer.get("is_compatible"):
            return []
        return [str(m) for m in answer.get("messages") or ["incompatible"]]
