"""The schema registry (Confluent REST API) of the local stack: ``tributary schemas serve`` as
a process of its own, storing its schemas on the broker's compacted ``_schemas`` topic."""

import sys
from pathlib import Path

from infra.stack.service import Service

NAME = "schema-registry"


class SchemaRegistryService(Service):
    name = NAME
    stop_timeout = 15.0

    def __init__(
        self,
        home: Path,
        port: int,
        bootstrap_servers: str,
        topic: str,
        kafka_env: dict[str, str] | None = None,
    ) -> None:
        super().__init__(home)
        self.port = port
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        # Kafka's security settings as variables (an existing cluster with SASL/TLS): the
        # process reads them as every part does.
        self.kafka_env = dict(kafka_env or {})

    def env(self) -> dict[str, str]:
        return self.kafka_env

    def ports(self) -> dict[int, str]:
        return {self.port: "TRIBUTARY_SCHEMA_REGISTRY_PORT"}

    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def binaries(self) -> list[Path | str]:
        return [sys.executable]

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "infra.cli",
            "schemas",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--bootstrap-servers",
            self.bootstrap_servers,
            "--topic",
            self.topic,
        ]

    def ready(self) -> bool:
        # The standard library's client: httpx's import (≈0.1 s) would be most of `status`;
        # imported here: `status` of a stack that is down does not pay for it (~20 ms).
        import http.client
        import urllib.request

        request = urllib.request.Request(f"{self.endpoint()}/subjects")
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return int(response.status) == 200
        except (OSError, http.client.HTTPException):  # refused, timed out, an error status,
            return False  # or a probe of a free port that connected to itself


def registry_answers(url: str) -> bool:
    """True when a registry at ``url`` (any, with credentials or TLS) answers ``GET /subjects``."""
    import httpx  # imported here: `status` starts fast

    try:
        return httpx.get(f"{url.rstrip('/')}/subjects", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
