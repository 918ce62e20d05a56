"""Whose fault an exception is: the command's (its rejection) or the infrastructure's (stop)."""

import json
import socket

import psycopg
import psycopg.errors as pg
import pytest
import sqlalchemy.exc
from confluent_kafka import KafkaException
from sqlalchemy import create_engine

from connectors.errors import KafkaError
from event_store import CommandBus, EventStore
from event_store.command_topic import (
    MAX_COMMAND_ID_CHARS,
    CommandEnvelope,
    handle_message,
    parse_envelope,
)
from event_store.errors import (
    CommandDecodeError,
    CommandRejected,
    ConcurrencyError,
    EventDecodeError,
    MalformedCommandError,
    SchemaMissingError,
    StorageError,
)
from event_store.faults import MAX_REASON_CHARS, command_fault, storable_text
from event_store.prepared import StatementsLost
from examples.social import social_registry


def _raised(exc: BaseException) -> BaseException:
    """``exc`` as a handler would raise it (with a traceback and a cause)."""
    try:
        raise exc
    except BaseException as caught:
        return caught


@pytest.mark.parametrize(
    ("exc", "words"),
    [
        (_raised(ZeroDivisionError("division by zero")), "ZeroDivisionError: division by zero"),
        (KeyError("author"), "KeyError: 'author'"),
        (ValueError("bad"), "ValueError: bad"),
        (RecursionError("maximum recursion depth exceeded"), "RecursionError"),
        (UnicodeEncodeError("utf-8", "\udc00", 0, 1, "surrogates not allowed"), "surrogates"),
        (CommandRejected("no user 99"), "no user 99"),
        (CommandDecodeError("CreatePost: author_id: Field required"), "author_id"),
    ],
    ids=["zero-division", "key", "value", "recursion", "unicode", "rejected", "decode"],
)
def test_a_handlers_exception_is_the_commands_fault(exc: Exception, words: str) -> None:
    reason = command_fault(exc)
    assert reason is not None and words in reason


@pytest.mark.parametrize(
    "exc",
    [
        pg.UntranslatableCharacter("unsupported Unicode escape sequence"),  # 22P05: NUL in jsonb
        pg.CharacterNotInRepertoire("invalid byte sequence for encoding UTF8: 0x00"),  # 22021
        pg.NumericValueOutOfRange('value "9223372036854775808" is out of range for bigint'),
        pg.UniqueViolation("duplicate key value violates unique constraint"),  # 23505
        pg.CheckViolation("new row violates check constraint"),  # 23514
        pg.ForeignKeyViolation("violates foreign key constraint"),  # 23503
        pg.ProgramLimitExceeded("index row size 19328 exceeds btree maximum 2704"),  # 54000
        psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"),  # client
        StorageError("appending to 'post-9' failed: unsupported Unicode escape", "22P05"),
        StorageError("handler query failed: out of range", "22003"),
        StorageError("appending failed: check constraint", "23514"),
        sqlalchemy.exc.DataError("SELECT 1", {}, pg.CharacterNotInRepertoire("0x00")),
    ],
    ids=lambda e: f"{type(e).__name__}-{getattr(e, 'sqlstate', None)}",
)
def test_data_the_database_refuses_is_the_commands_fault(exc: Exception) -> None:
    reason = command_fault(exc)
    assert reason is not None and reason.startswith("the database cannot store this command")


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.OperationalError("connection refused"),
        psycopg.InterfaceError("the connection is closed"),
        pg.AdminShutdown("terminating connection due to administrator command"),  # 57P01
        pg.ConnectionFailure("connection failure"),  # 08006
        pg.SerializationFailure("could not serialize access"),  # 40001
        pg.DeadlockDetected("deadlock detected"),  # 40P01
        pg.UndefinedTable("relation does not exist"),  # 42P01
        pg.SyntaxError("syntax error"),  # 42601
        pg.DiskFull("could not extend file"),  # 53100
        pg.InternalError_("internal error"),  # XX000
        StorageError("loading 'post-1' failed: server closed the connection", "08006"),
        StorageError("loading failed", None),
        SchemaMissingError("no table events: run create_schema", "42P01"),
        ConcurrencyError("post-1", 3, 4),
        StatementsLost("the server's prepared statements changed: run again"),
        EventDecodeError("a stored event does not fit its class: add an upcaster"),
        sqlalchemy.exc.OperationalError("SELECT 1", {}, psycopg.OperationalError("down")),
        sqlalchemy.exc.InterfaceError("SELECT 1", {}, psycopg.InterfaceError("closed")),
        sqlalchemy.exc.TimeoutError("QueuePool limit of size 5 overflow 10 reached"),
        ConnectionRefusedError(111, "Connection refused"),
        TimeoutError("timed out"),
        OSError("network is unreachable"),
        MemoryError(),
        KafkaError("results not delivered within 30 s"),
        KafkaException("_TRANSPORT"),
        KeyboardInterrupt(),
        SystemExit(1),
    ],
    ids=lambda e: f"{type(e).__name__}-{getattr(e, 'sqlstate', None)}",
)
def test_infrastructure_failures_are_not_the_commands_fault(exc: BaseException) -> None:
    assert command_fault(exc) is None


def test_a_reason_quoting_a_huge_value_is_bounded() -> None:
    reason = command_fault(KeyError("x" * 100_000))
    assert reason is not None
    assert len(reason) < MAX_REASON_CHARS + 100 and "more characters" in reason


def test_storable_text_escapes_only_what_postgresql_cannot_hold() -> None:
    assert storable_text("c\x00") == "c\\x00"
    assert storable_text("a\x00b\x00") == "a\\x00b\\x00"
    assert storable_text("\udc00x") == "\\udc00x"
    for ordinary in ("k-1", "héllo ✓", "back\\slash", ""):
        assert storable_text(ordinary) is ordinary or storable_text(ordinary) == ordinary
    once = storable_text("\x00\ud800")
    assert storable_text(once) == once
    once.encode()  # valid UTF-8 now


def test_an_unreachable_database_stops_the_processor_instead_of_a_rejection() -> None:
    engine = create_engine("postgresql+psycopg://app:pw@127.0.0.1:1/none?connect_timeout=2")
    bus = CommandBus(EventStore(engine, "es"), social_registry())
    message = json.dumps(
        {"command_id": "c-1", "type": "FollowUser", "data": {"follower_id": 1, "followee_id": 2}}
    ).encode()
    try:
        with pytest.raises(sqlalchemy.exc.OperationalError):
            handle_message(bus, message)
    finally:
        engine.dispose()


def test_an_envelope_refuses_a_command_id_no_index_could_hold() -> None:
    fits = "k" * MAX_COMMAND_ID_CHARS
    assert parse_envelope(CommandEnvelope(fits, "X", {}).to_json()).command_id == fits
    with pytest.raises(MalformedCommandError, match="longer than 512") as refused:
        parse_envelope(CommandEnvelope(fits + "k", "X", {}).to_json())
    assert refused.value.command_id == fits + "k"  # still answered under its id


def test_a_command_the_broker_does_not_acknowledge_is_an_error_and_the_producer_is_renewed() -> (
    None
):
    """A delivery that fails (here: nothing listens, the message times out) must not pass for
    a sent command; the next send starts a new producer (an idempotent producer fenced by a
    broker that lost its state never delivers again)."""
    from connectors.kafka import KafkaConfig
    from event_store.command_topic import CommandClient

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    kafka = KafkaConfig(f"127.0.0.1:{port}", extra={"message.timeout.ms": "300", "log_level": "0"})
    client = CommandClient(kafka)
    first = client._producer
    with pytest.raises(KafkaError, match="c-1 not delivered to commands"):
        client.send("CreatePost", {"post_id": 1}, command_id="c-1", key="k")
    assert client._producer is not first
