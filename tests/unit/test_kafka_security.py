"""SASL/TLS settings of an existing Kafka cluster reach every Kafka client Tributary creates.

Each client kind is built through its own code path with the confluent-kafka class replaced
by a recorder, so the properties it would connect with can be inspected without a broker;
one test builds real librdkafka clients from the same properties (and a real key and
certificate) to show librdkafka accepts and loads them.
"""

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from connectors.kafka.config import KafkaConfig
from infra.settings import Settings, load_settings

SECURITY = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "svc-tributary",
    "sasl.password": "sasl-Secret-9",
    "ssl.ca.location": "/etc/kafka/ca.pem",
    "ssl.certificate.location": "/etc/kafka/client.pem",
    "ssl.key.location": "/etc/kafka/client.key",
    "ssl.key.password": "key-Secret-8",
    "socket.keepalive.enable": "true",  # from TRIBUTARY_KAFKA_EXTRA
}


def secure_settings(**overrides: object) -> Settings:
    values: dict[str, object] = {
        "kafka_bootstrap_servers": "kafka-1.internal:9093",
        "kafka_security_protocol": "SASL_SSL",
        "kafka_sasl_mechanism": "SCRAM-SHA-512",
        "kafka_sasl_username": "svc-tributary",
        "kafka_sasl_password": "sasl-Secret-9",
        "kafka_ssl_ca_location": "/etc/kafka/ca.pem",
        "kafka_ssl_certificate_location": "/etc/kafka/client.pem",
        "kafka_ssl_key_location": "/etc/kafka/client.key",
        "kafka_ssl_key_password": "key-Secret-8",
        "kafka_extra": "socket.keepalive.enable=true",
    }
    values.update(overrides)
    return load_settings(**values)


class Recorder:
    """Stands in for confluent-kafka's client classes: records each client's properties."""

    def __init__(self) -> None:
        self.clients: list[tuple[str, dict[str, Any]]] = []

    def kind(self, name: str) -> type:
        clients = self.clients

        class Client:
            def __init__(self, config: dict[str, Any], **_: Any) -> None:
                clients.append((name, dict(config)))

            def list_topics(self, *_: Any, **__: Any) -> Any:
                return SimpleNamespace(topics={})

            def produce(self, *_: Any, on_delivery: Any = None, **__: Any) -> None:
                if on_delivery is not None:
                    on_delivery(None, None)

            def flush(self, *_: Any) -> int:
                return 0

            def poll(self, *_: Any) -> None:
                return None

            def close(self) -> None:
                pass

        return Client

    def patch(self, monkeypatch: pytest.MonkeyPatch, target: str, kind: str) -> None:
        monkeypatch.setattr(target, self.kind(kind))


def assert_secured(clients: list[tuple[str, dict[str, Any]]], kinds: set[str]) -> None:
    assert {kind for kind, _ in clients} == kinds
    for kind, config in clients:
        missing = {k: v for k, v in SECURITY.items() if config.get(k) != v}
        assert not missing, f"{kind} lacks {sorted(missing)}"
        assert config["bootstrap.servers"] == "kafka-1.internal:9093"


# -- the settings build the properties --------------------------------------------------


def test_settings_fold_security_into_every_clients_properties() -> None:
    kafka = secure_settings().kafka("some-client")
    props = kafka.client_properties(**{"group.id": "g"})
    assert SECURITY.items() <= props.items()
    assert props["client.id"] == "some-client"
    assert "sasl-Secret-9" not in repr(kafka) and "key-Secret-8" not in repr(kafka)


def test_inconsistent_security_settings_are_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match="TRIBUTARY_KAFKA_SECURITY_PROTOCOL=SASL_SSL"):
        load_settings(
            kafka_sasl_mechanism="PLAIN", kafka_sasl_username="u", kafka_sasl_password="p"
        )
    with pytest.raises(ValueError, match="SSL or SASL_SSL"):
        load_settings(kafka_security_protocol="SASL_PLAINTEXT", kafka_ssl_ca_location="/ca.pem")
    with pytest.raises(ValueError, match="TRIBUTARY_KAFKA_SASL_MECHANISM"):
        load_settings(kafka_security_protocol="SASL_SSL")
    with pytest.raises(ValueError, match="TRIBUTARY_KAFKA_SASL_USERNAME"):
        load_settings(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="PLAIN")
    with pytest.raises(ValueError, match="already sets: keep one"):
        secure_settings(kafka_extra="sasl.username=other")
    with pytest.raises(ValueError, match="TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS"):
        load_settings(kafka_extra="bootstrap.servers=elsewhere:9092")
    with pytest.raises(ValueError, match="key=value"):
        load_settings(kafka_extra="sasl.password:leaky")


def test_extra_properties_from_the_environment_and_other_mechanisms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRIBUTARY_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv(
        "TRIBUTARY_KAFKA_EXTRA",
        "sasl.mechanism=OAUTHBEARER, sasl.oauthbearer.method=oidc,"
        "sasl.oauthbearer.client.secret=oidc-Secret-7",
    )
    props = load_settings().kafka().client_properties()
    assert props["security.protocol"] == "SASL_SSL"
    assert props["sasl.mechanism"] == "OAUTHBEARER"
    assert props["sasl.oauthbearer.method"] == "oidc"
    assert "oidc-Secret-7" not in repr(load_settings().kafka())


# -- one test per client kind ------------------------------------------------------------


def test_admin_client(monkeypatch: pytest.MonkeyPatch) -> None:
    from connectors.kafka.admin import TopicAdmin

    recorder = Recorder()
    recorder.patch(monkeypatch, "connectors.kafka.admin.AdminClient", "admin")
    TopicAdmin(secure_settings().kafka("tributary-cli"))
    assert_secured(recorder.clients, {"admin"})


def test_consumers_of_the_kafka_adapters(monkeypatch: pytest.MonkeyPatch) -> None:
    from connectors.kafka import offsets, reading

    recorder = Recorder()
    recorder.patch(monkeypatch, "connectors.kafka.admin.AdminClient", "admin")
    recorder.patch(monkeypatch, "connectors.kafka.offsets.Consumer", "probe consumer")
    recorder.patch(monkeypatch, "connectors.kafka.reading.Consumer", "reading consumer")
    kafka = secure_settings().kafka("tributary-views")
    offsets.probe_consumer(kafka)
    assert reading.read_topic(kafka, "cdc.public.users") == []  # no partition: no reader
    reading._consumer(kafka, 100, 10)  # the consumer a partition with records is read by
    assert_secured(recorder.clients, {"admin", "probe consumer", "reading consumer"})


def test_cdc_publisher_producer(monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc.publisher import ChangePublisher

    recorder = Recorder()
    recorder.patch(monkeypatch, "cdc.publisher.Producer", "cdc producer")
    recorder.patch(monkeypatch, "connectors.kafka.admin.AdminClient", "admin")
    ChangePublisher(secure_settings().kafka("tributary-cdc-tributary"))
    assert_secured(recorder.clients, {"cdc producer", "admin"})
    producer = dict(recorder.clients)["cdc producer"]
    assert producer["enable.idempotence"] is True  # its own overrides stay


def test_command_processor_and_client(monkeypatch: pytest.MonkeyPatch) -> None:
    from event_store.command_topic import CommandClient, CommandProcessor

    recorder = Recorder()
    recorder.patch(monkeypatch, "connectors.kafka.following.Consumer", "processor consumer")
    recorder.patch(monkeypatch, "event_store.command_topic.Producer", "producer")
    recorder.patch(monkeypatch, "connectors.kafka.producing.Producer", "producer")
    kafka = secure_settings().kafka("tributary-commands")
    bus: Any = SimpleNamespace(
        store=SimpleNamespace(tables=SimpleNamespace(consumer_positions=None))
    )
    CommandProcessor(bus, kafka)
    CommandClient(kafka)
    CommandClient(kafka, one_shot=True)  # `tributary command`'s
    assert_secured(recorder.clients, {"processor consumer", "producer"})
    # the processor's consumer and producer, the clients'
    assert len(recorder.clients) == 4
    client, one_shot = (props for _, props in recorder.clients[2:])
    assert client["enable.idempotence"] is True
    assert "enable.idempotence" not in one_shot  # no producer id to wait for, and still
    assert one_shot["acks"] == "all"  # every replica acknowledges, no retry reorders
    assert one_shot["max.in.flight.requests.per.connection"] == 1


def test_dead_letter_producer(monkeypatch: pytest.MonkeyPatch) -> None:
    from projections.view import DeadLetter
    from views.dead_letters import DeadLetterQueue

    recorder = Recorder()
    recorder.patch(monkeypatch, "views.dead_letters.Producer", "dlq producer")
    recorder.patch(monkeypatch, "connectors.kafka.admin.AdminClient", "admin")
    monkeypatch.setattr("connectors.kafka.admin.TopicAdmin.ensure", lambda self, spec: True)
    queue = DeadLetterQueue(secure_settings().kafka("tributary-views"), "timeline")
    letter = DeadLetter(
        topic="events.post", partition=0, offset=7, key=b"k", value=b"v", reason="bad",
        stage="decode",
    )  # fmt: skip
    queue.send([letter])
    assert_secured(recorder.clients, {"dlq producer", "admin"})


def test_kafka_store_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    from connectors.stores import kafka as kafka_store
    from connectors.stores import kafka_ledger

    recorder = Recorder()
    recorder.patch(monkeypatch, "connectors.stores.kafka_ledger.Consumer", "store consumer")
    recorder.patch(monkeypatch, "connectors.stores.kafka.Producer", "store producer")
    kafka = secure_settings().kafka("tributary-views")
    kafka_ledger._consumer(kafka)
    kafka_store._producer(kafka)
    assert_secured(recorder.clients, {"store consumer", "store producer"})


def test_spark_source_consumers_get_the_view_jobs_kafka_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The view job passes ``kafka.<property>`` options; the source's planner and executor
    consumers apply them (no Spark session: the option and consumer code only)."""
    from spark_streaming import kafka_reader
    from spark_streaming.kafka_options import KafkaSourceOptions
    from spark_streaming.view_job import ViewJob

    job: Any = SimpleNamespace(
        kafka=secure_settings().kafka("tributary-views"),
        view=SimpleNamespace(topics=("events.post",), options={}),
        options=SimpleNamespace(
            fail_on_data_loss=True, max_offsets_per_trigger=None, extra_source_options={}
        ),
    )
    options = ViewJob.source_options(job, "earliest")
    assert options["kafka.sasl.password"] == "sasl-Secret-9"
    recorder = Recorder()
    recorder.patch(monkeypatch, "spark_streaming.kafka_reader.Consumer", "spark source consumer")
    kafka_reader.source_consumer(KafkaSourceOptions.parse(options))
    assert_secured(recorder.clients, {"spark source consumer"})


# -- librdkafka accepts and loads them ---------------------------------------------------


def _key_and_certificate(folder: Path, passphrase: str) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    key, cert = folder / "client.key", folder / "client.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-days", "1", "-subj", "/CN=tributary",
         "-keyout", str(key), "-out", str(cert), "-passout", f"pass:{passphrase}"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return key, cert


@pytest.mark.parametrize(
    "make",
    [
        lambda kafka: Producer(kafka.client_properties()),
        lambda kafka: Consumer(kafka.client_properties(**{"group.id": "g"})),
        lambda kafka: AdminClient(kafka.client_properties()),
    ],
    ids=["producer", "consumer", "admin"],
)
def test_librdkafka_loads_the_key_with_its_password(
    make: Callable[[KafkaConfig], Any], tmp_path: Path
) -> None:
    key, cert = _key_and_certificate(tmp_path, "key-Secret-8")
    files = {
        "kafka_bootstrap_servers": "127.0.0.1:1",
        "kafka_ssl_ca_location": str(cert),
        "kafka_ssl_certificate_location": str(cert),
        "kafka_ssl_key_location": str(key),
        "kafka_extra": "log_level=0",
    }
    make(secure_settings(**files).kafka("tls-check"))  # loads CA, certificate and key
    with pytest.raises(Exception, match=r"ssl\.key\.location"):  # the negative control
        make(secure_settings(**files, kafka_ssl_key_password="wrong").kafka("tls-check"))
