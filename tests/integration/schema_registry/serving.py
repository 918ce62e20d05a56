"""A registry serving HTTP from a thread of the test process, on a topic the test chooses."""

import threading
import time

import uvicorn

from connectors.kafka import KafkaConfig
from connectors.schema_registry.api import create_registry_app
from connectors.schema_registry.store import open_registry
from infra.stack.isolated import free_port_block


class RunningRegistry:
    """A registry serving HTTP from a thread of this process."""

    def __init__(self, kafka: KafkaConfig, topic: str) -> None:
        self.registry, self.store = open_registry(kafka, topic)
        port = free_port_block(1)
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(
            uvicorn.Config(
                create_registry_app(self.registry),
                host="127.0.0.1",
                port=port,
                log_level="warning",
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the registry did not start serving"
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.store.close()
