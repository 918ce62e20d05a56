"""Errors of the local stack, the supervisor and the CLI."""

from tributary.errors import TributaryError


class InfraError(TributaryError):
    """The local stack or the runtime could not do what was asked."""


class MissingBinaryError(InfraError):
    """A program the stack needs is not installed."""


class PortInUseError(InfraError):
    """A port the stack needs is taken by another process."""


class LowDiskSpaceError(InfraError):
    """The disk of the state folder has too little free space for a service to work."""


class StartTimeoutError(InfraError):
    """A service did not answer in time, or died while starting."""


class StateFolderError(InfraError):
    """The state folder cannot be used (permissions, foreign files)."""


class QueryDeclarationError(InfraError):
    """Views declare queries that cannot be served together (a name or path twice, a path
    placeholder without its parameter, ...): fix the view factory."""


class UnknownQueryError(InfraError):
    """No configured view declares a query by that name."""


class QueryArgumentError(InfraError):
    """An argument of a view query is missing, unknown, of the wrong type or out of range."""


class ReadYourWritesUnavailableError(InfraError):
    """Waiting for a position token is not possible here (the waiter cannot be loaded)."""


class WaitTimeoutError(InfraError, TimeoutError):
    """A condition polled for (:func:`infra.polling.poll_until`) did not hold in time."""
