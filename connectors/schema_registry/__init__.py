"""A schema registry speaking Confluent Schema Registry's REST API (Avro), stored on a
compacted topic in Confluent's record format; and the pure Avro compatibility check it uses."""

from connectors.schema_registry.compat import (
    DEFAULT_LEVEL,
    LEVELS,
    Incompatibility,
    can_read,
    incompatibilities,
    level_incompatibilities,
)
from connectors.schema_registry.errors import SchemaRegistryError
from connectors.schema_registry.records import RegistryState, SchemaVersion
from connectors.schema_registry.registry import MemoryLog, ParsedSchema, SchemaRegistry

__all__ = [
    "DEFAULT_LEVEL",
    "LEVELS",
    "Incompatibility",
    "MemoryLog",
    "ParsedSchema",
    "RegistryState",
    "SchemaRegistry",
    "SchemaRegistryError",
    "SchemaVersion",
    "can_read",
    "incompatibilities",
    "level_incompatibilities",
]
