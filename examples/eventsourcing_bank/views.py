"""The balances view: each account's holder, balance, number of transactions and whether it is
closed, in a typed PostgreSQL table (``<views schema>.bank_balances``), from
``events.bank_account``.

The fold (:mod:`examples.eventsourcing_bank.folds`) keeps accounts, transactions and closures
as position-guarded entries; in the same transaction, the balances of the accounts a batch
touched are recounted from the transactions held, so a redelivered or replayed event never
counts twice and the table always equals the sum of what was applied.
"""

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from connectors.errors import StoreUnavailableError
from connectors.stores.pg_tables import TypedColumn, TypedTable
from connectors.stores.postgres import PostgresStore
from examples.eventsourcing_bank.folds import ACCOUNTS, CLOSED, TRANSACTIONS
from projections.view import Query, QueryParam, View, per_partition
from tributary.view_model import Applied, Put
from tributary.view_store import Collection, StoreTxn
from views.catalog import ViewsConfig

NAME = "bank_balances"
BALANCES = "balances"
STREAM_TYPE = "bank_account"
COLUMNS = (
    TypedColumn("account_id", "uuid"),
    TypedColumn("full_name", "text"),
    TypedColumn("email_address", "text"),
    TypedColumn("balance", "numeric"),
    TypedColumn("transactions", "integer"),
    TypedColumn("closed", "boolean"),
)


def balances_table(table: str = NAME) -> TypedTable:
    return TypedTable(BALANCES, table, COLUMNS, ("account_id",))


def _accounts_touched(applied: Sequence[Applied]) -> set[str]:
    touched: set[str] = set()
    for change in applied:
        write = change.write
        if write.collection in (ACCOUNTS, CLOSED):
            touched.add(write.key)
        elif write.collection == TRANSACTIONS and isinstance(write, Put):
            touched.add(str(write.fields["account_id"]))
    return touched


def recount_balances(txn: StoreTxn, applied: Sequence[Applied]) -> None:
    """Recompute the balance row of every account this batch touched."""
    for account in sorted(_accounts_touched(applied)):
        opened = txn.get(ACCOUNTS, account)
        amounts = [
            Decimal(str(e.fields["amount"])) for e in txn.find(TRANSACTIONS, "account_id", account)
        ]
        holder = {} if opened is None else dict(opened.fields)
        txn.put(
            BALANCES,
            account,
            {
                "account_id": account,
                "full_name": holder.get("full_name"),
                "email_address": holder.get("email_address"),
                "balance": str(sum(amounts, Decimal("0.00"))),
                "transactions": len(amounts),
                "closed": txn.get(CLOSED, account) is not None,
            },
        )


def balances_view(
    dsn: str,
    schema: str,
    topics: tuple[str, ...],
    name: str = NAME,
    *,
    read_dsn: str | None = None,
    registry_url: str,
) -> View:
    """The balances view: its store writes through ``dsn``, its query reads through
    ``read_dsn`` (default ``dsn``)."""
    query_dsn = read_dsn or dsn
    table = balances_table(name)
    store = PostgresStore(
        dsn,
        schema,
        name,
        (
            Collection(ACCOUNTS),
            Collection(TRANSACTIONS, lookups=("account_id",)),
            Collection(CLOSED),
            table,
        ),
        recount_balances,
    )

    def balance(account_id: str) -> dict[str, Any]:
        try:
            with psycopg.connect(query_dsn, connect_timeout=5) as conn:
                row = conn.execute(
                    sql.SQL(
                        "SELECT account_id, full_name, email_address, balance, transactions, closed"
                        " FROM {} WHERE account_id::text = %s"
                    ).format(sql.Identifier(schema, table.table)),
                    (account_id,),
                ).fetchone()
        except psycopg.errors.UndefinedTable:
            row = None
        except psycopg.OperationalError as exc:
            raise StoreUnavailableError(f"bank balances store unreachable: {exc}") from exc
        if row is None:
            raise LookupError(f"no account {account_id}")
        return {
            "account_id": str(row[0]),
            "full_name": row[1],
            "email_address": row[2],
            "balance": str(row[3]),
            "transactions": row[4],
            "closed": row[5],
        }

    return View(
        name=name,
        topics=topics,
        fold=per_partition("examples.eventsourcing_bank.folds:fold_bank", registry=registry_url),
        store=store,
        description="each bank account's holder, balance and transaction count (PostgreSQL)",
        queries=(
            Query(
                "bank_balance",
                "/bank/accounts/{account_id}",
                (QueryParam("account_id", str, where="path", required=True),),
                balance,
                "An account's balance, as the eventsourcing application's events made it.",
            ),
        ),
    )


def bank_views(config: ViewsConfig) -> list[View]:
    """``TRIBUTARY_VIEWS=examples.eventsourcing_bank:bank_views``: the balances view on the
    configured stores and topics."""
    topic = f"{config.event_topic_prefix}{STREAM_TYPE}"
    return [
        balances_view(
            config.postgres_dsn,
            config.views_schema,
            (topic,),
            read_dsn=config.read_dsn,
            registry_url=config.schema_registry_url,
        )
    ]
