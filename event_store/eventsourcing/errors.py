"""Errors of the ``eventsourcing`` persistence module that are Tributary's own.

What the library's callers catch stays the library's: a conflicting append is its
:class:`eventsourcing.persistence.IntegrityError`, a database failure its ``OperationalError``
and so on (the module maps PostgreSQL's errors as the library's PostgreSQL module does).
"""

from event_store.errors import EventStoreError


class EventsourcingSettingsError(EventStoreError, OSError):
    """A setting of the module is missing or wrong. An ``OSError``, as the library's own
    settings errors are, so code written for the library catches it unchanged."""
