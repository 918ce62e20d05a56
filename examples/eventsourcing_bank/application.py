"""The ``eventsourcing`` library's bank accounts example, with transfers.

The domain (``BankAccount``: opened, transactions appended, overdraft limit, closed) and the
application (``BankAccounts``) are the ones the library ships with its test cases; ``Bank``
adds withdrawals and transfers. Nothing here knows about Tributary: the persistence module is
chosen by the environment (``PERSISTENCE_MODULE=event_store.eventsourcing``).
"""

from decimal import Decimal
from uuid import UUID

from eventsourcing.tests.application import BankAccounts

__all__ = ["Bank"]


class Bank(BankAccounts):
    """Deposits, withdrawals and transfers between accounts."""

    def deposit(self, account_id: UUID, amount: Decimal) -> None:
        if amount <= 0:
            raise ValueError(f"a deposit must be positive, got {amount}")
        self.credit_account(account_id, amount)

    def withdraw(self, account_id: UUID, amount: Decimal) -> None:
        """Raises ``InsufficientFundsError`` past the account's overdraft limit."""
        if amount <= 0:
            raise ValueError(f"a withdrawal must be positive, got {amount}")
        self.credit_account(account_id, -amount)

    def transfer(self, from_id: UUID, to_id: UUID, amount: Decimal) -> None:
        """Debit one account and credit the other in one atomic save: both or neither
        (another writer in between makes the save fail with ``IntegrityError``)."""
        if amount <= 0 or from_id == to_id:
            raise ValueError("a transfer moves a positive amount between two accounts")
        source, target = self.get_account(from_id), self.get_account(to_id)
        source.append_transaction(-amount)
        target.append_transaction(amount)
        self.save(source, target)

    def close_account(self, account_id: UUID) -> None:
        account = self.get_account(account_id)
        account.close()
        self.save(account)
