"""An application written with the ``eventsourcing`` library, run on Tributary.

The library's bank accounts example (``Bank``: open, deposit, withdraw, transfer, close) runs
unchanged with ``PERSISTENCE_MODULE=event_store.eventsourcing``: its events go through the
event store's outbox and CDC to ``events.bank_account``, and the balances view
(``TRIBUTARY_VIEWS=examples.eventsourcing_bank:bank_views``) folds them into a PostgreSQL table
that equals the application's own aggregates
(``tests/integration/eventsourcing/test_bank_example.py``).
"""

from examples.eventsourcing_bank.application import Bank
from examples.eventsourcing_bank.views import balances_view, bank_views

__all__ = ["Bank", "balances_view", "bank_views"]
