"""The command topics' wire format: the topics' names, the ``commands`` envelope and its
decoding (shared by the processor, the client that sends commands, and the HTTP API).

``commands``: key = the aggregate's stream id (so one stream's commands stay in order on one
partition), value = JSON ``{"command_id": str, "type": str, "data": {…}}``.
``command-results``: key = the command id, value = the result's JSON
(``{"status": "accepted", …}`` or ``{"status": "rejected", "reason": …}``).
"""

import json
from dataclasses import dataclass
from typing import Any

from connectors.kafka import KafkaConfig, TopicAdmin, TopicSpec
from event_store.errors import MalformedCommandError


@dataclass(frozen=True)
class CommandTopics:
    """Names and partition count of the command and result topics."""

    commands: str = "commands"
    results: str = "command-results"
    partitions: int = 4

    def specs(self) -> list[TopicSpec]:
        return [
            TopicSpec(self.commands, self.partitions, "delete"),
            TopicSpec(self.results, self.partitions, "delete"),
        ]


def ensure_topics(kafka: KafkaConfig, topics: CommandTopics) -> None:
    """Create the command and result topics if absent (checking them otherwise)."""
    admin = TopicAdmin(kafka)
    for spec in topics.specs():
        admin.ensure(spec)


@dataclass(frozen=True)
class CommandEnvelope:
    """A decoded ``commands`` message: its id, its type name and its data (not yet checked)."""

    command_id: str
    type: str
    data: dict[str, Any]

    def to_json(self) -> bytes:
        return json.dumps(
            {"command_id": self.command_id, "type": self.type, "data": self.data}
        ).encode()


#: The longest command id an envelope may carry: up to 2 kB in UTF-8, which the primary
#: key's index of the commands table always holds (a btree row holds about 2.7 kB).
MAX_COMMAND_ID_CHARS = 512


def parse_envelope(value: bytes | None) -> CommandEnvelope:
    """Decode a message value; raises :class:`MalformedCommandError` saying what is wrong."""
    if value is None:
        raise MalformedCommandError("message has no value (expected a JSON command envelope)")
    try:
        parsed = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedCommandError(f"message value is not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise MalformedCommandError("message value must be a JSON object")
    command_id = parsed.get("command_id")
    if not isinstance(command_id, str) or not command_id.strip():
        raise MalformedCommandError("command_id is missing or not a non-empty string")
    if len(command_id) > MAX_COMMAND_ID_CHARS:
        raise MalformedCommandError(
            f"command_id is longer than {MAX_COMMAND_ID_CHARS} characters ({len(command_id)}):"
            " the store cannot index it; send a shorter idempotency key (a UUID)",
            command_id,
        )
    command_type = parsed.get("type")
    if not isinstance(command_type, str) or not command_type:
        raise MalformedCommandError("type is missing or not a non-empty string", command_id)
    data = parsed.get("data", {})
    if not isinstance(data, dict):
        raise MalformedCommandError("data must be a JSON object", command_id)
    extra = sorted(set(parsed) - {"command_id", "type", "data"})
    if extra:
        raise MalformedCommandError(f"unknown envelope fields: {', '.join(extra)}", command_id)
    return CommandEnvelope(command_id, command_type, data)
