"""Errors of the view layer."""

from tributary.errors import TributaryError


class ViewError(TributaryError):
    """A view could not be found, reached or operated."""


class UnknownViewError(ViewError):
    """A view name that no configured view has."""


class InvalidPositionTokenError(ViewError, ValueError):
    """A position token that is not ``<stream_type>/<stream_id>@<version>``."""


class ViewsLaggingError(ViewError):
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


class DeadLetterError(ViewError):
    """Dead letters could not be published, listed or re-fed (the message says which and why)."""
