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


class UnknownViewError(StreamingError):
    """A view name that no configured view has."""


class ReplayError(StreamingError):
    """A rebuild failed; the live view was left as it was."""


class InvalidPositionTokenError(StreamingError, ValueError):
    """A position token that is not ``<stream_type>/<stream_id>@<version>``."""


class ViewsLaggingError(StreamingError):
    """Views that read a command's topic did not apply its events in time.

    ``lagging`` maps each such view to why it lags; ``token`` is the position waited for.
    """

    def __init__(self, token: str, lagging: dict[str, str], timeout: float) -> None:
        self.token = token
        self.lagging = dict(lagging)
        reasons = "; ".join(f"{view}: {reason}" for view, reason in self.lagging.items())
        super().__init__(
            f"{len(self.lagging)} view(s) did not apply {token} within {timeout:g} s: {reasons} "
            "(is `tributary run views` running? `tributary views` shows where each view stands)"
        )

    @property
    def views(self) -> list[str]:
        return list(self.lagging)


class CheckpointLostError(StreamingError):
    """A view that keeps state in Spark's checkpoint lost it (or it disagrees with the view's
    stores): the view must be rebuilt from offset zero, never resumed with empty state."""
