"""The JVM publisher's set-up: the Java producer's properties, and the compiled class."""

from pathlib import Path

import pytest

from cdc.jvm_publisher import PRODUCER_DEFAULTS, classes_dir, compiled_classes, java_properties
from connectors.kafka.config import KafkaConfig


def test_plain_bootstrap_and_client_id_with_the_publishers_producer_settings() -> None:
    props = java_properties(KafkaConfig("127.0.0.1:9092", client_id="tributary-cdc-x"))
    assert props == {
        **PRODUCER_DEFAULTS,
        "bootstrap.servers": "127.0.0.1:9092",
        "client.id": "tributary-cdc-x",
    }
    assert props["enable.idempotence"] == "true" and props["acks"] == "all"


@pytest.mark.parametrize(
    ("mechanism", "module"),
    [
        ("PLAIN", "org.apache.kafka.common.security.plain.PlainLoginModule"),
        ("SCRAM-SHA-512", "org.apache.kafka.common.security.scram.ScramLoginModule"),
    ],
)
def test_sasl_credentials_become_the_login_modules_options(mechanism: str, module: str) -> None:
    kafka = KafkaConfig(
        "broker:9093",
        extra={
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": mechanism,
            "sasl.username": "svc",
            "sasl.password": 'p"w\\d',
            "ssl.ca.location": "/etc/ca.pem",
        },
    )
    props = java_properties(kafka)
    assert props is not None
    assert props["security.protocol"] == "SASL_SSL"
    assert props["sasl.mechanism"] == mechanism
    assert props["sasl.jaas.config"] == f'{module} required username="svc" password="p\\"w\\\\d";'
    assert props["ssl.truststore.type"] == "PEM"
    assert props["ssl.truststore.location"] == "/etc/ca.pem"
    assert "sasl.username" not in props and "sasl.password" not in props


@pytest.mark.parametrize(
    "extra",
    [
        {"ssl.key.location": "/etc/key.pem"},  # no Java equivalent mapped
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"},
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"},  # no credentials
    ],
)
def test_properties_without_a_known_java_equivalent_leave_it_to_python(
    extra: dict[str, str],
) -> None:
    assert java_properties(KafkaConfig("broker:9093", extra=extra)) is None


def test_the_class_compiles_once_into_a_folder_named_by_its_sources(tmp_path: Path) -> None:
    first = compiled_classes(tmp_path)
    assert first == classes_dir(tmp_path)
    assert (first / "io" / "tributary" / "cdc" / "ChangeProducer.class").is_file()
    made = first.stat().st_mtime_ns
    assert compiled_classes(tmp_path) == first
    assert first.stat().st_mtime_ns == made  # not compiled again
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no scratch folder left
