"""The integration session on brought services: what it reads from the environment, how it
names what it makes and which topics it removes (tests/integration/brought.py), and Kafka's
security settings handed to a child process."""

import re

import pytest

from infra.settings import load_settings
from tests.integration.brought import BroughtSession, brought, unique_name

KAFKA = "TRIBUTARY_TEST_KAFKA_BOOTSTRAP_SERVERS"
PG = "TRIBUTARY_TEST_POSTGRES_URL"


def test_neither_starts_a_stack_and_only_one_is_refused() -> None:
    assert brought({}) is None
    with pytest.raises(ValueError, match="both"):
        brought({KAFKA: "k:9092"})
    with pytest.raises(ValueError, match="both"):
        brought({PG: "postgresql://u@h/db"})


def test_security_settings_come_along_as_settings_fields() -> None:
    values = brought(
        {
            KAFKA: "k:9093",
            PG: "postgresql://u:pw@h:5432/app",
            "TRIBUTARY_TEST_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "TRIBUTARY_TEST_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "TRIBUTARY_TEST_KAFKA_SASL_USERNAME": "svc",
            "TRIBUTARY_TEST_KAFKA_SASL_PASSWORD": "s3cret",
            "TRIBUTARY_TEST_KAFKA_EXTRA": "socket.timeout.ms=30000",
            "TRIBUTARY_KAFKA_SASL_PASSWORD": "not-this-one",
        }
    )
    assert values is not None
    session = BroughtSession(values, tag="ghij")
    overrides = session.settings_overrides()
    assert overrides["kafka_sasl_password"] == "s3cret"
    assert overrides["postgres_url"] == "postgresql+psycopg://u:pw@h:5432/tributary_test_ghij"
    assert overrides["commands_topic"] == "commands-ghij"
    settings = load_settings(**overrides)
    props = settings.kafka().client_properties()
    assert props["security.protocol"] == "SASL_SSL"
    assert props["sasl.username"] == "svc" and props["sasl.password"] == "s3cret"
    assert props["socket.timeout.ms"] == "30000"


def test_a_child_gets_the_same_kafka_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings(
        kafka_bootstrap_servers="k:9093",
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-256",
        kafka_sasl_username="svc",
        kafka_sasl_password="s3cret",
        kafka_ssl_ca_location="/ca.pem",
        kafka_extra="socket.timeout.ms=30000,client.rack=r1",
    )
    env = settings.kafka_security_env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    child = load_settings(kafka_bootstrap_servers="k:9093")
    assert child.kafka_properties() == settings.kafka_properties()
    assert load_settings().kafka_security_env() == env
    for name in env:
        monkeypatch.delenv(name)
    assert load_settings().kafka_security_env() == {}


def test_unique_names_start_with_the_tag_and_never_hold_another() -> None:
    name = unique_name("ghij")
    assert re.fullmatch("ghij[0-9a-f]{6}", name)
    assert re.fullmatch("[0-9a-f]{10}", unique_name(None))


def test_topics_removed_are_the_new_ones_and_only_the_tagged_ones_beside_another_session() -> None:
    session = BroughtSession({}, tag="qrst", topics_before={"old", "commands"})
    now = {
        "old",
        "commands",
        "t-qrst0a1b2c",
        "commands-qrst",
        "_schemas-qrst",
        "cdc-qrst.public.users",
        "fixed-name",
        "t-wxyz0a1b2c",
        "history0a1b2c",
    }
    assert session.topics_to_delete(now, others=[]) == sorted(now - {"old", "commands"})
    assert session.topics_to_delete(now, others=["tributary_test_wxyz"]) == [
        "_schemas-qrst",
        "cdc-qrst.public.users",
        "commands-qrst",
        "t-qrst0a1b2c",
    ]
