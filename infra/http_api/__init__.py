"""The HTTP API: commands in, the views' queries out (``tributary serve``); one module per
concern: ``commands``, ``queries``, ``health``, ``metrics`` (``prometheus-client``), ``auth``,
``errors``, put together by ``app``.

- ``POST /commands`` takes the ``commands`` topic's envelope (``command_id`` optional) and runs
  the command through the same :class:`~event_store.CommandBus` as the command processor;
  ``wait_views=true`` then waits until the views applied the result's position token.
- one ``GET`` route per query the configured views declare (:class:`projections.view.Query`),
  typed and range-checked from its :class:`~projections.view.QueryParam`; ``min_position``
  waits for a position token before the query runs.
- ``GET /health``: the database and every view's store.
- ``GET /metrics``: each view's last batch id and its own counters (e.g. an analytics job's
  late events) in Prometheus' text format.

Who may do what: with ``TRIBUTARY_API_TOKEN`` set, ``POST /commands`` needs
``Authorization: Bearer <token>``; with ``TRIBUTARY_API_READ_TOKEN`` set, so do the query routes
(the read token, or the command token). ``/health``, ``/metrics`` and ``/docs`` stay open. A
missing token is 401 (with ``WWW-Authenticate: Bearer``), a wrong one 403.

Every error answers JSON ``{"error": reason}``: 422 for a request that does not fit (bad JSON,
an unknown command type, a parameter out of range), 400 for what a query refused, 404 for what
it did not find, 503 when a store or the database cannot be reached (never a wrong answer), 504
when the views did not catch up with a token in time. Reasons never carry a password or token
(:func:`tributary.redact.redact`).
"""

from infra.http_api.api import Api
from infra.http_api.app import create_app
from infra.http_api.commands import read_envelope
from infra.http_api.gateway import CommandGateway
from infra.http_api.metrics import metrics_text

__all__ = ["Api", "CommandGateway", "create_app", "metrics_text", "read_envelope"]
