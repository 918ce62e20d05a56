"""The eventsourcing module's naming, state handling and settings (no database needed)."""

import json
from decimal import Decimal
from uuid import UUID, uuid4

import pytest
from eventsourcing.cipher import AESCipher
from eventsourcing.compressor import ZlibCompressor
from eventsourcing.domain import Aggregate
from eventsourcing.persistence import (
    DatetimeAsISO,
    InfrastructureFactory,
    JSONTranscoder,
    Mapper,
    UUIDAsHex,
)
from eventsourcing.tests.application import BankAccounts
from eventsourcing.tests.domain import BankAccount
from eventsourcing.utils import Environment, get_topic
from hypothesis import given
from hypothesis import strategies as st

from event_store.eventsourcing import EventsourcingSettingsError, TributaryFactory
from event_store.eventsourcing.factory import fill_from_dsn
from event_store.eventsourcing.naming import event_naming, json_state, snake_case


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("BankAccount", "bank_account"),
        ("HTTPServer", "http_server"),
        ("Account2", "account2"),
        ("bank_account", "bank_account"),
        ("Dog-Walker app", "dog_walker_app"),
        ("", ""),
    ],
)
def test_snake_case(name: str, expected: str) -> None:
    assert snake_case(name) == expected


def test_a_nested_event_class_names_its_aggregate() -> None:
    naming = event_naming(get_topic(BankAccount.TransactionAppended), "Bank")
    assert naming.stream_type == "bank_account"  # -> events.bank_account
    assert naming.event_type == "BankAccount.TransactionAppended"
    deep = event_naming("shop.domain:Shop.Basket.ItemAdded", "Shop")
    assert (deep.stream_type, deep.event_type) == ("basket", "Shop.Basket.ItemAdded")


def test_an_event_without_an_enclosing_class_belongs_to_the_application() -> None:
    assert event_naming("shop.events:ItemAdded", "ShopApp").stream_type == "shop_app"
    assert event_naming("topic1", "BankAccounts").stream_type == "bank_accounts"
    assert event_naming("topic1", "").stream_type == "eventsourcing"
    assert event_naming("topic1", "").event_type == "topic1"


def test_the_library_json_state_becomes_the_rows_data() -> None:
    app = BankAccounts()
    account = BankAccount.open(full_name="Alice", email_address="alice@example.com")
    account.append_transaction(Decimal("10.00"))
    for event in account.collect_events():
        stored = app.mapper.to_stored_event(event)
        state = json_state(stored.state)
        assert state is not None and state.class_version == 1
        assert json.loads(state.text) == json.loads(stored.state)
    app.close()


def test_a_ciphered_or_compressed_state_is_kept_as_bytes() -> None:
    env = Environment(env={"CIPHER_KEY": AESCipher.create_key(16)})
    transcoder = JSONTranscoder()
    transcoder.register(DatetimeAsISO())
    transcoder.register(UUIDAsHex())
    event = Aggregate.Event(
        originator_id=uuid4(), originator_version=2, timestamp=Aggregate.Event.create_timestamp()
    )
    plain = Mapper[UUID](transcoder).to_stored_event(event).state
    assert json_state(plain) is not None
    for mapper in (
        Mapper[UUID](transcoder, cipher=AESCipher(env)),
        Mapper[UUID](transcoder, compressor=ZlibCompressor()),
    ):
        assert json_state(mapper.to_stored_event(event).state) is None


@pytest.mark.parametrize(
    "state",
    [
        b"state1",
        b"",
        b"[1, 2]",
        b'"a string"',
        b"{not json",
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": 1e+16}',
        b'{"a": 1.5E-7}',
        b'{"a": -0.0}',
        b'{"a": "\\u0000"}',
        b'{"a": "\\ud83d\\udc08"}',
        b'{"a": "\\udc08"}',
        b"{\xff}",
        b"\x00{}",
    ],
)
def test_a_state_jsonb_would_not_give_back_is_kept_as_bytes(state: bytes) -> None:
    assert json_state(state) is None


def test_class_version_is_the_schema_version() -> None:
    state = json_state(b'{"amount": 1, "class_version": 3}')
    assert state is not None and state.class_version == 3
    odd = json_state(b'{"class_version": "3"}')
    assert odd is not None and odd.class_version == 1


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(st.dictionaries(st.text(), JSON, max_size=6))
def test_a_kept_json_state_means_what_the_transcoder_wrote(value: dict[str, object]) -> None:
    data = JSONTranscoder().encode(value)
    state = json_state(data)
    if state is not None:
        assert json.loads(state.text) == value
        assert "\\u0000" not in state.text


def test_a_dsn_fills_the_connection_settings_not_set_one_by_one() -> None:
    env = Environment("Bank", {"BANK_POSTGRES_HOST": "db.internal"})
    fill_from_dsn(env, "postgresql+psycopg://app:secret@127.0.0.1:6543/tributary")
    assert env.get("POSTGRES_HOST") == "db.internal"
    assert (env.get("POSTGRES_PORT"), env.get("POSTGRES_DBNAME")) == ("6543", "tributary")
    assert (env.get("POSTGRES_USER"), env.get("POSTGRES_PASSWORD")) == ("app", "secret")
    bare = Environment(env={})
    fill_from_dsn(bare, "dbname=tributary")
    assert bare.get("POSTGRES_PASSWORD") == "" and bare.get("POSTGRES_HOST") == ""


def test_a_bad_dsn_is_refused_without_echoing_it() -> None:
    with pytest.raises(EventsourcingSettingsError) as raised:
        fill_from_dsn(Environment(env={}), "host=x password=hunter2 nonsense")
    assert "hunter2" not in str(raised.value)


def factory_env(**extra: str) -> dict[str, str]:
    return {
        "PERSISTENCE_MODULE": "event_store.eventsourcing",
        "POSTGRES_DSN": "postgresql://app:secret@127.0.0.1:1/tributary",
        **extra,
    }


def test_the_library_selects_the_module_and_reads_its_settings() -> None:
    factory = InfrastructureFactory.construct(
        Environment("BankAccounts", factory_env(POSTGRES_SCHEMA="bank_store"))
    )
    assert isinstance(factory, TributaryFactory)
    config = factory.recorder_config()
    assert (config.schema, config.application, config.originator_id_type) == (
        "bank_store",
        "BankAccounts",
        "uuid",
    )
    assert TributaryFactory(Environment(env=factory_env())).recorder_config().schema == (
        "event_store"
    )
    factory.close()


@pytest.mark.parametrize(
    "extra",
    [{"POSTGRES_SCHEMA": "Bad-Name"}, {"SINGLE_ROW_TRACKING": "no"}],
)
def test_wrong_settings_are_refused_as_oserrors(extra: dict[str, str]) -> None:
    with pytest.raises(EventsourcingSettingsError) as raised:
        TributaryFactory(Environment(env=factory_env(**extra)))
    assert isinstance(raised.value, OSError)
    assert next(iter(extra)) in str(raised.value)
