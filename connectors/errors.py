"""Errors raised by the adapters, with the underlying client's code kept."""

from tributary.errors import TributaryError


class ConnectorError(TributaryError):
    """An outside system (Kafka, PostgreSQL, ...) refused or failed a request."""


class KafkaError(ConnectorError):
    """A Kafka request failed. ``code`` is librdkafka's error name when there is one."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message if code is None else f"{message} [{code}]")
        self.code = code


class TopicRewoundError(KafkaError):
    """A partition ends below offsets read before: the topic was created again or its log
    truncated, so what was read of it before no longer holds."""


class TopicConfigMismatchError(KafkaError):
    """An existing topic differs from the spec Tributary needs."""


class StoreError(ConnectorError):
    """A view store refused or failed a request (the batch is retried when the job restarts)."""


class StoreUnavailableError(StoreError):
    """A view store cannot be reached (readers answer 503, never a wrong answer)."""


class LedgerGapError(StoreError):
    """A batch starts past the offsets the store reached: the records in between were never
    applied. The view job restarts its query from the store's offsets."""


class StaleGenerationError(StoreError):
    """The view was rebuilt and swapped while this job ran: restart the job to follow the new
    generation (``tributary run views`` restarts it by itself)."""


class ReadRoleError(ConnectorError):
    """A role cannot be made the views' read-only role (it can already do more than read)."""
