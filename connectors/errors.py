"""Errors raised by the adapters, with the underlying client's code kept."""

from tributary.errors import TributaryError


class ConnectorError(TributaryError):
    """An outside system (Kafka, PostgreSQL, ...) refused or failed a request."""


class KafkaError(ConnectorError):
    """A Kafka request failed. ``code`` is librdkafka's error name when there is one."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message if code is None else f"{message} [{code}]")
        self.code = code


class TopicConfigMismatchError(KafkaError):
    """An existing topic differs from the spec Tributary needs."""
