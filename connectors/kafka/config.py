"""Connection settings handed to the Kafka adapters (never read from the environment here)."""

from dataclasses import dataclass, field

ClientValue = str | int | float | bool


@dataclass(frozen=True)
class KafkaConfig:
    """Where the brokers are and any extra librdkafka properties (security, timeouts...)."""

    bootstrap_servers: str
    client_id: str = "tributary"
    extra: dict[str, str] = field(default_factory=dict)

    def client_properties(self, **overrides: ClientValue) -> dict[str, ClientValue]:
        """librdkafka properties for any client: bootstrap, client id, extras, then overrides."""
        props: dict[str, ClientValue] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": self.client_id,
        }
        props.update(self.extra)
        props.update(overrides)
        return props
