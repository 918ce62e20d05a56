"""Redis, the cache views' store."""

import shutil
from pathlib import Path

from infra.errors import MissingBinaryError
from infra.stack.service import Service


class RedisService(Service):
    name = "redis"

    def __init__(self, home: Path, port: int, binary: str) -> None:
        super().__init__(home)
        self.port = port
        self.binary = binary

    def ports(self) -> dict[int, str]:
        return {self.port: "TRIBUTARY_REDIS_PORT"}

    def endpoint(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def binaries(self) -> list[Path | str]:
        return [self.binary]

    def argv(self) -> list[str]:
        resolved = shutil.which(self.binary)
        if resolved is None:
            raise MissingBinaryError(f"{self.binary} not found: run `make setup`")
        return [
            resolved,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes",
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            "",
        ]

    def ready(self) -> bool:
        import redis  # imported here: `status` starts fast

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=1).ping())
        except redis.RedisError:
            return False
