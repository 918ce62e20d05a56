"""Connection settings handed to the Kafka adapters (never read from the environment here)."""

import re
from dataclasses import dataclass, field

ClientValue = str | int | float | bool

# librdkafka properties whose values are secrets: never shown (repr, logs, exports).
_SECRET_PROPERTY = re.compile(r"password|secret|jaas\.config|key\.pem|keystore|credential", re.I)


def is_secret_property(name: str) -> bool:
    """Whether a client property holds a secret (``sasl.password``, ``ssl.key.password``,
    ``sasl.oauthbearer.client.secret``, ``ssl.key.pem``, ...)."""
    return _SECRET_PROPERTY.search(name) is not None


@dataclass(frozen=True)
class KafkaConfig:
    """Where the brokers are and any extra librdkafka properties (security, timeouts...).

    ``extra`` reaches every client through :meth:`client_properties`: security settings of an
    existing cluster (``security.protocol``, ``sasl.*``, ``ssl.*``) go there.
    """

    bootstrap_servers: str
    client_id: str = "tributary"
    extra: dict[str, str] = field(default_factory=dict)
    admin_timeout_s: float = 15.0  # metadata and topic calls of TopicAdmin

    def client_properties(self, **overrides: ClientValue) -> dict[str, ClientValue]:
        """librdkafka properties for any client: bootstrap, client id, extras, then overrides."""
        props: dict[str, ClientValue] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": self.client_id,
        }
        props.update(self.extra)
        props.update(overrides)
        return props

    def __repr__(self) -> str:
        shown = {k: "***" if is_secret_property(k) else v for k, v in self.extra.items()}
        return (
            f"KafkaConfig(bootstrap_servers={self.bootstrap_servers!r},"
            f" client_id={self.client_id!r}, extra={shown!r})"
        )
