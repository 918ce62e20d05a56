import shutil
from pathlib import Path

import pytest

from infra.errors import LowDiskSpaceError, MissingBinaryError
from infra.settings import load_settings
from infra.stack import LocalStack
from infra.stack.stack import MIB


def test_a_missing_binary_names_the_fix_and_starts_nothing(tmp_path: Path) -> None:
    stack = LocalStack(
        load_settings(home=tmp_path / "state", postgres_bin_dir=tmp_path / "no-such-dir")
    )
    with pytest.raises(MissingBinaryError) as err:
        stack.up()
    assert "no-such-dir/postgres" in str(err.value)
    assert "make setup" in str(err.value)
    assert not (tmp_path / "state").exists()
    assert all(s.pid is None for s in stack.status())


def test_the_registry_on_an_existing_kafka_starts_no_broker_and_gets_its_security(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings(
        home=tmp_path / "state",
        kafka_bootstrap_servers="kafka.example:9093",
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="svc",
        kafka_sasl_password="s3cret",
    )
    started: list[str] = []
    monkeypatch.setattr(LocalStack, "_preflight", lambda self, todo: None)
    monkeypatch.setattr("infra.stack.service.Service.start", lambda self: started.append(self.name))
    monkeypatch.setattr("infra.stack.service.Service.wait_ready", lambda self, proc, t: None)
    monkeypatch.setattr("infra.stack.service.Service.ready", lambda self: False)
    stack = LocalStack(settings)
    stack.up(["schema-registry"])
    assert started == ["schema-registry"]
    assert stack.registry is not None
    assert stack.registry.env()["TRIBUTARY_KAFKA_SASL_PASSWORD"] == "s3cret"
    assert "kafka.example:9093" in stack.registry.argv()
    local = LocalStack(load_settings(home=tmp_path / "other"))
    started.clear()
    local.up(["schema-registry"])
    assert started == ["objectstore", "broker", "schema-registry"]  # a local registry, its broker


def test_too_little_disk_for_the_brokers_storage_names_the_fix_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SeaweedFS marks its volumes read-only near a full disk and the broker then hangs on every
    # write (a CI run's topics timed out that way). The disk's figures are the one stand-in.
    free = {"bytes": 900 * MIB}
    real = shutil.disk_usage

    def disk_usage(path: str | Path) -> "shutil._ntuple_diskusage":
        usage = real(path)
        return type(usage)(usage.total, usage.used, free["bytes"])

    started: list[str] = []
    monkeypatch.setattr("infra.stack.stack.shutil.disk_usage", disk_usage)
    monkeypatch.setattr("infra.stack.service.Service.start", lambda self: started.append(self.name))
    monkeypatch.setattr("infra.stack.service.Service.wait_ready", lambda self, proc, t: None)
    monkeypatch.setattr("infra.stack.service.Service.ready", lambda self: False)
    stack = LocalStack(load_settings(home=tmp_path / "state"))
    with pytest.raises(LowDiskSpaceError) as err:
        stack.up()
    message = str(err.value)
    assert "only 900 MiB free" in message
    assert "objectstore stops taking writes below 256 MiB" in message
    assert "TRIBUTARY_HOME" in message
    assert started == []
    assert not (tmp_path / "state").exists()
    # Services that need no such room start on the same disk.
    stack.up(["postgres", "redis"])
    assert sorted(started) == ["postgres", "redis"]
    # Enough room for the storage: the whole stack starts.
    free["bytes"] = 1024 * MIB
    started.clear()
    stack.up(["broker"])
    assert started == ["objectstore", "broker"]
