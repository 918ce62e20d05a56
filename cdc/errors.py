"""Errors of change data capture."""

from tributary.errors import TributaryError


class CdcError(TributaryError):
    """Change data capture failed."""


class PublishError(CdcError):
    """A change could not be written to Kafka; the connector stops and commits nothing."""


class ConnectorFailedError(CdcError):
    """The Debezium engine stopped with an error."""
