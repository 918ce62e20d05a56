"""Errors of the consumer SDK."""

from connectors.errors import KafkaError


class SubscriberError(KafkaError):
    """A subscription could not be set up, read or committed."""


class UndecodableRecordError(SubscriberError):
    """A record is not a change event or an event (raised by the ``raise_undecodable`` policy:
    the record's offset is not committed, so the next subscriber meets it again)."""


class DeadLetterError(SubscriberError):
    """A dead letter was not acknowledged: the subscriber stops before committing the record,
    so nothing is lost (fix the broker or the topic's ACLs and start it again)."""
