"""Errors of the Spark streaming layer."""

from tributary.errors import TributaryError


class StreamingError(TributaryError):
    """A streaming query or view job failed."""


class SourceOptionError(StreamingError):
    """The Kafka source was given options it cannot use (the message names the option)."""


class DataLossError(StreamingError):
    """Offsets the query needs are no longer on the broker (deleted, or the topic was recreated).

    Set ``failOnDataLoss=false`` to skip what is gone and continue from the earliest offset left.
    """


class ReplayError(StreamingError):
    """A rebuild failed; the live view was left as it was."""


class CheckpointLostError(StreamingError):
    """A view that keeps state in Spark's checkpoint lost it (or it disagrees with the view's
    stores): the view must be rebuilt from offset zero, never resumed with empty state."""
