import logging

import pytest

from infra.settings import load_settings
from tributary.redact import (
    MASK,
    RedactingFilter,
    install_log_redaction,
    redact,
    redact_data,
    redact_url,
    register_secret,
    url_password,
)


@pytest.mark.parametrize(
    ("text", "secret", "kept"),
    [
        ("postgresql+psycopg://app:s3cret@db:5432/x", "s3cret", "postgresql+psycopg://app:***@db"),
        ("redis://:s3cret@cache:6379/0", "s3cret", "redis://:***@cache:6379/0"),
        ("redis://user:p@ss@cache/0 failed", "p@ss", "redis://user:***@cache/0 failed"),
        ("host=db port=5432 password=s3cret user=app", "s3cret", "host=db port=5432 password=***"),
        ("sasl.password=s3cret,sasl.username=svc", "s3cret", "sasl.username=svc"),
        ('{"ssl.key.password": "s3cret", "x": 1}', "s3cret", '"ssl.key.password": "***"'),
        ("Authorization: Bearer abc.def-123", "abc.def-123", "Authorization: Bearer ***"),
    ],
)
def test_passwords_in_urls_pairs_and_bearer_credentials_are_masked(
    text: str, secret: str, kept: str
) -> None:
    out = redact(text)
    assert secret not in out
    assert kept in out


def test_text_without_secrets_is_unchanged() -> None:
    for text in (
        "postgresql://postgres@127.0.0.1:15432/tributary",
        "http://127.0.0.1:18080/timeline/1?limit=5",
        "password authentication failed for user app",
        "connection to server at 127.0.0.1, port 1 failed: Connection refused",
        '{"position_token": "post/p-1@3"}',
    ):
        assert redact(text) == text


def test_registered_secrets_are_masked_in_any_form() -> None:
    register_secret("Pg Secret%2F1", None, "", "ab")  # too short values are not registered
    out = redact('unexpected spaces found in "Pg Secret/1" (ab)')
    assert "Pg Secret/1" not in out and MASK in out
    assert "(ab)" in out
    assert redact("given Pg Secret%2F1") == f"given {MASK}"


def test_loading_settings_registers_their_secrets() -> None:
    load_settings(
        postgres_url="postgresql+psycopg://app:pg-Registered-1@db/x",
        redis_url="redis://:redis-Registered-2@cache/0",
        api_token="api-Registered-3",
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="PLAIN",
        kafka_sasl_username="svc",
        kafka_sasl_password="sasl-Registered-4",
        kafka_extra="sasl.oauthbearer.client.secret=oidc-Registered-5",
    )
    text = "pg-Registered-1 redis-Registered-2 api-Registered-3 sasl-Registered-4 oidc-Registered-5"
    assert redact(text) == " ".join([MASK] * 5)


def test_settings_repr_masks_urls_and_secrets() -> None:
    settings = load_settings(
        postgres_url="postgresql+psycopg://app:repr-Secret-1@db/x", api_token="repr-Token-2"
    )
    shown = repr(settings)
    assert "repr-Secret-1" not in shown and "repr-Token-2" not in shown
    assert "postgresql+psycopg://app:***@db/x" in shown


def test_url_helpers() -> None:
    assert url_password("postgresql://app:p%40ss@db/x") == "p%40ss"
    assert url_password("postgresql://app@db/x") is None
    assert url_password("not a url") is None
    assert redact_url("redis://:x-secret@cache/0") == "redis://:***@cache/0"


def test_redact_data_masks_nested_strings_only() -> None:
    data = {"error": "password=abc123", "rows": [("redis://:abc123@h/0", 3)], "n": 1}
    assert redact_data(data) == {"error": "password=***", "rows": [("redis://:***@h/0", 3)], "n": 1}


def test_log_records_are_masked_whatever_the_handler(caplog: pytest.LogCaptureFixture) -> None:
    install_log_redaction()
    register_secret("log-Secret-6")
    log = logging.getLogger("tributary.test.redact")
    with caplog.at_level(logging.INFO):
        log.info("connecting to %s", "postgresql://app:log-Secret-6@db/x")
        log.info("GET %s %d", "/timeline/1?token=log-Secret-6", 200)
        try:
            raise RuntimeError('unexpected spaces found in "log-Secret-6"')
        except RuntimeError:
            log.exception("failed")
    text = caplog.text
    assert "log-Secret-6" not in text
    assert "postgresql://app:***@db/x" in text and "GET /timeline/1?token=*** 200" in text
    assert "RuntimeError" in text


def test_redacting_filter_for_handlers_configured_elsewhere() -> None:
    register_secret("filter-Secret-7")
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "pw %s", ("filter-Secret-7",), None)
    assert RedactingFilter().filter(record)
    assert record.getMessage() == f"pw {MASK}"
