from pathlib import Path

import pydantic
import pytest

from infra.settings import load_settings


def test_defaults_point_at_the_local_stack(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings()
    assert settings.home == Path(".tributary")
    assert settings.bootstrap_servers == "127.0.0.1:19092"
    assert settings.database_url == "postgresql+psycopg://postgres@127.0.0.1:15432/tributary"
    assert settings.cache_url == "redis://127.0.0.1:16379/0"
    assert settings.uses_local_stack


def test_environment_overrides_file_overrides_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "tributary.toml"
    config.write_text('broker_port = 29092\nredis_port = 26379\nhome = "/srv/trib"\n')
    monkeypatch.setenv("TRIBUTARY_CONFIG_FILE", str(config))
    monkeypatch.setenv("TRIBUTARY_BROKER_PORT", "39092")
    settings = load_settings()
    assert settings.broker_port == 39092
    assert settings.redis_port == 26379
    assert settings.home == Path("/srv/trib")


def test_external_endpoints_replace_the_local_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS", "kafka-1:9092,kafka-2:9092")
    monkeypatch.setenv("TRIBUTARY_POSTGRES_URL", "postgresql+psycopg://app@db/prod")
    settings = load_settings()
    assert settings.kafka().bootstrap_servers == "kafka-1:9092,kafka-2:9092"
    assert settings.database_url == "postgresql+psycopg://app@db/prod"
    assert not settings.uses_local_stack


def test_settings_are_frozen_and_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings()
    with pytest.raises(pydantic.ValidationError):
        settings.broker_port = 1  # type: ignore[misc]
    monkeypatch.setenv("TRIBUTARY_BROKER_PORT", "not-a-port")
    with pytest.raises(pydantic.ValidationError):
        load_settings()
