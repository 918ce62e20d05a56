"""What the module adds to the library's contract: the outbox rows it writes, exact states under
the library's cipher and compressor, notification ids that a tailing reader never sees out of
order under concurrent, conflicting writers, and a lock that holds up only its own
application."""

import base64
import threading
import time
from decimal import Decimal
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from eventsourcing.cipher import AESCipher
from eventsourcing.persistence import DataError, IntegrityError, StoredEvent
from eventsourcing.utils import Environment
from sqlalchemy import create_engine

from event_store import EventStore, NewEvent
from event_store.eventsourcing import TributaryFactory
from examples.eventsourcing_bank import Bank
from tests.integration.conftest import Endpoints
from tests.integration.eventsourcing.conftest import environment


def rows(stack: Endpoints, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(stack.postgres_dsn) as conn:
        return conn.execute(
            "SELECT stream_id, stream_type, version, event_type, schema_version, data, metadata"
            f" FROM {schema}.events ORDER BY position"
        ).fetchall()


def test_the_outbox_rows_name_the_aggregate_and_keep_the_librarys_part(
    stack: Endpoints, eventsourcing_env: str
) -> None:
    bank = Bank()
    account = bank.open_account("Ada", "ada@example.com")
    bank.deposit(account, Decimal("12.50"))
    bank.close()
    opened, deposited = rows(stack, eventsourcing_env)
    assert opened[:5] == (str(account), "bank_account", 2, "BankAccount.Opened", 1)
    assert deposited[:5] == (str(account), "bank_account", 3, "BankAccount.TransactionAppended", 1)
    assert deposited[5]["amount"] == {"_type_": "decimal_str", "_data_": "12.50"}
    assert deposited[6] == {
        "eventsourcing": {
            "application": "Bank",
            "notification_id": 2,
            "topic": "eventsourcing.tests.domain:BankAccount.TransactionAppended",
        }
    }


def test_cipher_and_compressor_states_are_kept_exactly_and_stay_unreadable(
    stack: Endpoints, eventsourcing_env: str
) -> None:
    env = {
        "CIPHER_KEY": AESCipher.create_key(16),
        "COMPRESSOR_TOPIC": "eventsourcing.compressor:ZlibCompressor",
        "IS_SNAPSHOTTING_ENABLED": "y",
    }
    bank = Bank(env=env)
    account = bank.open_account("Grace", "grace@example.com")
    bank.deposit(account, Decimal("7.00"))
    bank.take_snapshot(account)
    [notification, _] = bank.recorder.select_notifications(1, 10)
    assert bank.get_balance(account) == Decimal("7.00")  # from the snapshot
    bank.close()
    again = Bank(env=env)  # a new process: events decrypted from the store
    assert again.repository.get(account, version=2).balance == Decimal("7.00")
    again.close()
    for _, _, _, _, _, data, metadata in rows(stack, eventsourcing_env):
        assert data == {}  # nothing readable: the event is encrypted
        state = base64.b64decode(metadata["eventsourcing"]["state"])
        assert b"Grace" not in state
    first = base64.b64decode(rows(stack, eventsourcing_env)[0][6]["eventsourcing"]["state"])
    assert first == notification.state  # byte for byte


def test_a_tailing_reader_never_skips_an_id_while_writers_conflict(eventsourcing_env: str) -> None:
    factory = TributaryFactory(Environment("Tail", {**environment(), "POSTGRES_POOL_SIZE": "8"}))
    recorder = factory.application_recorder()
    shared = [uuid4() for _ in range(3)]  # writers race for these streams' versions
    done = threading.Event()
    conflicts: list[int] = []
    seen: list[int] = []
    errors: list[BaseException] = []

    def write(worker: int) -> None:
        try:
            for i in range(60):
                stream = shared[i % 3] if i % 4 == 0 else uuid4()
                version = i if stream in shared else 1
                events = [StoredEvent(stream, version + k, "tail:Event", b"{}") for k in range(3)]
                try:
                    recorder.insert_events(events)
                except IntegrityError:
                    conflicts.append(worker)
        except BaseException as exc:
            errors.append(exc)

    def read() -> None:
        try:
            last = 0
            while not done.is_set() or last < (recorder.max_notification_id() or 0):
                page = recorder.select_notifications(last, 50, inclusive_of_start=False)
                ids = [n.id for n in page]
                # every page continues exactly where the last one stopped: nothing skipped
                assert ids == list(range(last + 1, last + 1 + len(ids)))
                seen.extend(ids)
                last = ids[-1] if ids else last
        except BaseException as exc:
            errors.append(exc)

    reader = threading.Thread(target=read)
    writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    reader.start()
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    done.set()
    reader.join(60)
    last = recorder.max_notification_id()
    factory.close()
    assert errors == []
    assert conflicts  # some writes lost a race and were rolled back, ids included
    assert last is not None and last > 300
    assert seen == list(range(1, last + 1))  # gap-free, in order, each once


def test_a_writer_holding_its_applications_ids_blocks_no_other_writer(
    stack: Endpoints, eventsourcing_env: str
) -> None:
    env = environment()
    held = TributaryFactory(Environment("Held", env))
    other = TributaryFactory(Environment("Other", env))
    held_recorder = held.application_recorder()
    other_recorder = other.application_recorder()
    store = EventStore(create_engine(stack.database_url), eventsourcing_env)
    # An insert of "Held" that has not committed yet holds its counter row.
    with held_recorder.connection() as conn, conn.transaction():
        held_recorder.write_events(conn, [StoredEvent(uuid4(), 1, "held:Event", b"{}")])
        began = time.monotonic()
        other_recorder.insert_events([StoredEvent(uuid4(), 1, "other:Event", b"{}")])
        store.append("post-1", [NewEvent("PostCreated", {"post_id": 1})], 0, stream_type="post")
        assert time.monotonic() - began < 2  # neither waited for the open transaction
        blocked = threading.Event()

        def same_application() -> None:
            held_recorder.insert_events([StoredEvent(uuid4(), 1, "held:Event", b"{}")])
            blocked.set()

        waiter = threading.Thread(target=same_application)
        waiter.start()
        assert not blocked.wait(1)  # the application's own next writer waits its turn
    waiter.join(10)
    assert blocked.is_set()
    assert [n.id for n in held_recorder.select_notifications(1, 10)] == [1, 2]
    store.engine.dispose()
    held.close()
    other.close()


def test_a_version_the_store_cannot_keep_is_refused(eventsourcing_env: str) -> None:
    factory = TributaryFactory(Environment("Versions", environment()))
    recorder = factory.application_recorder()
    with pytest.raises(DataError):
        recorder.insert_events([StoredEvent(uuid4(), 2**31, "v:Event", b"{}")])
    with pytest.raises(DataError):
        recorder.insert_events([StoredEvent("not-a-uuid", 1, "v:Event", b"{}")])
    assert recorder.max_notification_id() is None  # nothing was stored
    factory.close()
