"""Our schema registry in memory, with the client methods the event code calls: the real
registry's code without HTTP or a broker (for unit tests and benchmarks)."""

from typing import Any

from connectors.schema_registry import (
    MemoryLog,
    ParsedSchema,
    RegistryState,
    SchemaRegistry,
    SchemaRegistryError,
)

__all__ = ["MemoryRegistry"]


class MemoryRegistry:
    """A :class:`SchemaRegistry` over an in-memory log, with the client's methods."""

    def __init__(self) -> None:
        state = RegistryState()
        self.registry = SchemaRegistry(state, MemoryLog(state))

    def register(self, subject: str, schema: str) -> int:
        return self.registry.register(subject, ParsedSchema(schema, None, []))

    def lookup(self, subject: str, schema: str) -> dict[str, Any] | None:
        try:
            return self.registry.lookup(subject, ParsedSchema(schema, None, [])).as_dict()
        except SchemaRegistryError:
            return None

    def schema_text(self, schema_id: int) -> str:
        return self.registry.schema_by_id(schema_id).schema

    def check(self, subject: str, schema: str) -> list[str]:
        return self.registry.test_compatibility(subject, ParsedSchema(schema, None, []), None)
