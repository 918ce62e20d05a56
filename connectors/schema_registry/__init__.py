"""A schema registry speaking Confluent Schema Registry's REST API (Avro), stored on a
compacted topic in Confluent's record format; and the pure Avro compatibility check it uses.

The names below are loaded on first use (PEP 562): a module that needs only the errors
(``connectors.schema_registry.errors``, e.g. a view query's) does not import the registry and
its Avro library (fastavro, ~40 ms).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOMES = {
    "DEFAULT_LEVEL": "compat",
    "LEVELS": "compat",
    "Incompatibility": "compat",
    "can_read": "compat",
    "incompatibilities": "compat",
    "level_incompatibilities": "compat",
    "SchemaRegistryError": "errors",
    "RegistryState": "records",
    "SchemaVersion": "records",
    "MemoryLog": "registry",
    "ParsedSchema": "registry",
    "SchemaRegistry": "registry",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
