"""The library's bank accounts example end to end on Tributary: deposits, withdrawals and
transfers through an ``eventsourcing`` application on the module, the real CDC connector
publishing the event store's outbox to ``events.bank_account``, Confluent's own
``AvroDeserializer`` decoding every record, a downstream consumer rebuilding the aggregates
from the records alone with the library's mapper, and the balances view on Spark, all
compared with the application's own aggregates."""

import json
import random
import threading
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any
from unittest.mock import patch
from uuid import UUID

import psycopg
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import IntegrityError, StoredEvent
from eventsourcing.tests.domain import BankAccount, InsufficientFundsError

from connectors.kafka import TopicAdmin
from examples.eventsourcing_bank import Bank, balances_view
from spark_streaming.view_job import ViewJob
from tests.integration.cdc_process import CdcProcess
from tests.integration.conftest import Endpoints
from tests.integration.kafka_reading import read_topic, wait_until
from views.catalog import JobOptions

TOPIC = "events.bank_account"

Factory = Callable[..., CdcProcess]


def run_the_bank(bank: Bank, rng: random.Random) -> list[UUID]:
    """Open accounts, then deposits, withdrawals (some refused: insufficient funds) and
    transfers, two of them racing for the same accounts; close one account."""
    accounts = [bank.open_account(f"Holder {n}", f"holder{n}@example.com") for n in range(8)]
    for account in accounts:
        bank.deposit(account, Decimal("100.00"))
    refused = 0
    for _ in range(120):
        a, b = rng.sample(accounts, 2)
        amount = Decimal(rng.randint(1, 6000)) / 100
        try:
            match rng.choice(("deposit", "withdraw", "transfer", "transfer")):
                case "deposit":
                    bank.deposit(a, amount)
                case "withdraw":
                    bank.withdraw(a, amount)
                case _:
                    bank.transfer(a, b, amount)
        except InsufficientFundsError:
            refused += 1
    assert refused > 0  # the aggregate refused some: nothing of those was stored

    # Two transfers from the same account at once, forced to race: each has loaded both
    # accounts before either saves, so optimistic concurrency must refuse exactly one.
    source = bank.get_account(accounts[0])
    targets = {to: bank.get_account(to) for to in accounts[1:3]}
    results: dict[UUID, str] = {}
    both_loaded = threading.Barrier(2, timeout=60)
    save = bank.save

    def save_once_both_loaded(*aggregates: Any, **kwargs: Any) -> Any:
        both_loaded.wait()
        return save(*aggregates, **kwargs)

    def transfer(to: UUID) -> None:
        try:
            bank.transfer(accounts[0], to, Decimal("0.01"))
            results[to] = "ok"
        except IntegrityError:
            results[to] = "conflict"

    with patch.object(bank, "save", save_once_both_loaded):
        threads = [threading.Thread(target=transfer, args=(to,)) for to in targets]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(results) == 2, results  # neither thread died
    # Each accepted transfer is stored whole, a refused one not at all: no lost update.
    accepted = list(results.values()).count("ok")
    after = bank.get_account(accounts[0])
    assert (after.version, after.balance) == (
        source.version + accepted,
        source.balance - accepted * Decimal("0.01"),
    )
    for to, before in targets.items():
        moved = 1 if results[to] == "ok" else 0
        account = bank.get_account(to)
        assert (account.version, account.balance) == (
            before.version + moved,
            before.balance + moved * Decimal("0.01"),
        )
    assert accepted == 1, results  # the race was real: optimistic concurrency refused one

    bank.close_account(accounts[-1])
    bank.take_snapshot(accounts[1])  # a snapshot is a cache: never published
    return accounts


def test_bank_accounts_through_cdc_into_a_spark_view_equal_the_aggregates(
    stack: Endpoints,
    eventsourcing_env: str,
    connector_factory: Factory,
    spark: Any,
    unique: str,
    tmp_path: Path,
) -> None:
    schema = eventsourcing_env
    bank = Bank(env={"IS_SNAPSHOTTING_ENABLED": "y"})
    accounts = run_the_bank(bank, random.Random(25))
    recorded = bank.recorder.max_notification_id()
    assert recorded is not None
    notifications = bank.recorder.select_notifications(start=1, limit=recorded)
    assert [n.id for n in notifications] == list(range(1, recorded + 1))  # gap-free
    ours = {str(a) for a in accounts}

    connector = connector_factory([f"{schema}.events"], cdc_outbox_table=f"{schema}.events")
    connector.start()

    def published() -> list[Any]:
        if TOPIC not in TopicAdmin(stack.kafka).topic_names():
            return []
        return [r for r in read_topic(stack.kafka, TOPIC) if (r.key or b"").decode() in ours]

    wait_until(lambda: len(published()) >= recorded, 180, f"{recorded} events on {TOPIC}", 1)
    records = published()
    assert len(records) == recorded  # each event once; no snapshot

    # Confluent's own deserializer, with the registry's URL, decodes every record.
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": stack.settings.registry_url}))
    context = SerializationContext(TOPIC, MessageField.VALUE)
    values = [deserialize(r.value, context) for r in records]
    by_notification = {}
    for record, value in zip(records, values, strict=True):
        assert value["stream_type"] == "bank_account"
        assert value["stream_id"] == record.key.decode()
        assert record.headers["event_type"].decode() == value["event_type"]
        assert record.headers["version"].decode() == str(value["version"])
        library = json.loads(value["metadata"])["eventsourcing"]
        assert library["application"] == "Bank"
        assert library["topic"] == f"eventsourcing.tests.domain:{value['event_type']}"
        by_notification[library["notification_id"]] = value
    assert sorted(by_notification) == list(range(1, recorded + 1))
    assert {v["event_type"] for v in values} == {
        "BankAccount.Opened",
        "BankAccount.TransactionAppended",
        "BankAccount.Closed",
    }
    for notification in notifications:  # the same events as the application's log
        value = by_notification[notification.id]
        assert UUID(value["stream_id"]) == notification.originator_id
        assert value["version"] == notification.originator_version + 1
        assert json.loads(value["data"]) == json.loads(notification.state)

    # A downstream consumer rebuilds every account from the records alone, with the
    # library's mapper (its transcodings registered, as the application registers them).
    rebuilt: dict[str, Any] = {}
    for value in sorted(values, key=lambda v: (v["stream_id"], v["version"])):
        event = bank.mapper.to_domain_event(
            StoredEvent(
                originator_id=UUID(value["stream_id"]),
                originator_version=value["version"] - 1,
                topic=json.loads(value["metadata"])["eventsourcing"]["topic"],
                state=value["data"].encode(),
            )
        )
        aggregate: Aggregate | None = rebuilt.get(value["stream_id"])
        rebuilt[value["stream_id"]] = event.mutate(aggregate)
    for account in accounts:
        own, copy = bank.get_account(account), rebuilt[str(account)]
        assert isinstance(copy, BankAccount)
        assert (copy.balance, copy.version, copy.is_closed) == (
            own.balance,
            own.version,
            own.is_closed,
        )

    # The balances view on Spark equals the application's aggregates.
    views_schema = f"views_{unique}"
    view = balances_view(
        stack.postgres_dsn,
        views_schema,
        (TOPIC,),
        f"bank_balances_{unique}",
        registry_url=stack.settings.registry_url,
    )
    options = JobOptions(checkpoint_root=tmp_path / "checkpoints", max_offsets_per_trigger=100)
    try:
        job = ViewJob(spark, view, stack.kafka, options)
        query = job.start(available_now=True)
        query.awaitTermination(600)
        assert query.exception() is None
        job.close()
        with psycopg.connect(stack.postgres_dsn) as conn:
            rows = conn.execute(
                f"SELECT account_id, full_name, email_address, balance, transactions, closed"
                f" FROM {views_schema}.bank_balances_{unique}"
            ).fetchall()
        view_rows = {str(r[0]): r[1:] for r in rows if str(r[0]) in ours}
        expected = {}
        for account in accounts:
            own = bank.get_account(account)
            transactions = sum(
                1
                for n in notifications
                if n.originator_id == account and n.topic.endswith("TransactionAppended")
            )
            expected[str(account)] = (
                own.full_name,
                own.email_address.address,
                own.balance,
                transactions,
                own.is_closed,
            )
        assert view_rows == expected
        assert view.queries[0].run(account_id=str(accounts[0]))["balance"] == str(
            bank.get_balance(accounts[0])
        )
    finally:
        bank.close()
        with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {views_schema} CASCADE")
