"""``tributary`` with the test's stand-in waiter (:class:`BatchWaiter`) in place of
``ViewWaiter``, for the ``tributary query --min-position`` tests."""

from infra import view_queries
from infra.cli import app
from tests.integration.api.library import BatchWaiter

view_queries.default_waiter = lambda views, settings: BatchWaiter(views)  # type: ignore[assignment]

if __name__ == "__main__":
    app()
