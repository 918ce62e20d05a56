"""Errors of the view layer."""

from tributary.errors import TributaryError


class ProjectionError(TributaryError):
    """A view could not turn its input into writes, or a sink could not apply them."""


class RecordRejectedError(ProjectionError):
    """One record cannot be projected (it goes to the dead-letter queue, the view moves on)."""


class StaleGenerationError(ProjectionError):
    """The view was rebuilt and swapped while this job ran: restart the job to follow the new
    generation (``tributary run views`` restarts it by itself)."""


class SinkError(ProjectionError):
    """The sink refused a batch (database error); the batch is retried when the job restarts."""
