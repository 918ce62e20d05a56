"""The command side wired from the settings: the handlers' registry (loaded by name), its
event schemas registered, the domain's tables prepared, and the command bus every entry point
(the ``commands`` topic, HTTP, the Python client) runs commands through."""

from typing import TYPE_CHECKING, Any

from event_store.command_wire import CommandTopics
from infra.plugins import load_named
from tributary.errors import TributaryError

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from connectors.kafka import KafkaConfig
    from connectors.partition_owners import Ownership
    from event_store import CommandBus, CommandRegistry
    from infra.settings import Settings

__all__ = [
    "command_bus",
    "command_ownership",
    "command_topics",
    "load_registry",
    "ownership_group",
    "prepare_database",
    "register_schemas",
]


def command_topics(s: "Settings") -> CommandTopics:
    """The ``commands`` and ``command-results`` topics the settings name."""
    return CommandTopics(s.commands_topic, s.command_results_topic, s.command_topic_partitions)


def load_registry(spec: str) -> tuple["CommandRegistry", Any]:
    """The registry named by ``module:factory`` (a factory or an instance), and its module."""
    from event_store import CommandRegistry

    target, module = load_named(spec, "command handlers", "TRIBUTARY_COMMAND_HANDLERS", "registry")
    registry = target() if callable(target) else target
    if not isinstance(registry, CommandRegistry):
        raise TributaryError(f"{spec} did not give a CommandRegistry (got {type(registry)})")
    return registry, module


def prepare_database(s: "Settings", engine: "Engine", module: Any) -> None:
    """Create what is missing in PostgreSQL: the event store's schema, and the domain's tables
    (the handlers module's ``prepare_database(connection)`` hook, when it has one)."""
    from event_store import create_schema

    with engine.begin() as conn:
        create_schema(conn, s.event_store_schema)
        prepare = getattr(module, "prepare_database", None)
        if callable(prepare):
            hook: Any = prepare
            hook(conn)


def register_schemas(s: "Settings", registry: "CommandRegistry") -> None:
    """Register the domain's event schemas in the schema registry: an event type the
    registry refuses as incompatible raises (naming the fields), so no event of that version
    is ever appended; from then on every appended event carries its schema's id."""
    from connectors.schema_registry.client import RegistryClient

    client = RegistryClient(s.registry_url)
    try:
        registry.codec.register_schemas(client)
    finally:
        client.close()


def command_bus(s: "Settings", engine: "Engine", registry: "CommandRegistry") -> "CommandBus":
    """The command bus every entry point (topic, HTTP) runs commands through (register the
    event schemas with :func:`register_schemas` before the first command)."""
    from event_store import CommandBus, EventStore, SnapshotPolicy

    return CommandBus(
        EventStore(engine, s.event_store_schema),
        registry,
        SnapshotPolicy(s.event_store_snapshot_every),
        max_retries=s.event_store_max_retries,
    )


def ownership_group(s: "Settings") -> str:
    """The group the command processors of these settings divide the partitions in."""
    return f"commands:{s.command_processor_name}:{s.commands_topic}"


def command_ownership(s: "Settings", kafka: "KafkaConfig") -> "Ownership":
    """This processor's membership of its group (joined): the partitions of ``commands`` are
    divided among every processor running with the same name and topic."""
    from connectors.kafka import TopicAdmin
    from connectors.partition_owners import Ownership

    partitions = TopicAdmin(kafka).partition_count(s.commands_topic)
    if not partitions:
        raise TributaryError(f"topic {s.commands_topic} does not exist")
    group = ownership_group(s)
    return Ownership(
        s.postgres().dsn,
        group,
        partitions,
        s.command_owner_timeout_s,
        max_poll_interval_s=s.command_max_poll_interval_s,
    ).join()
