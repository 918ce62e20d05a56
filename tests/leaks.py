"""Recognisable secrets for the tests that prove none leaks, and the CLI run with them."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PG = "PgLeakSecret1"
PG_ECHOED = "Pg LeakEcho 9"  # libpq quotes a password with a space in its error
READ_PG = "ReadLeakSecret2"
REDIS = "RedisLeakSecret3"
COMMAND_TOKEN = "CmdLeakToken4"
READ_TOKEN = "ReadLeakToken5"
SASL = "SaslLeakSecret6"
SSL_KEY = "KeyLeakSecret7"
KEYSTORE = "KeystoreLeakSecret8"
SPARK_KEY = "SparkLeakSecret10"
SECRETS = (
    PG,
    PG_ECHOED,
    READ_PG,
    REDIS,
    COMMAND_TOKEN,
    READ_TOKEN,
    SASL,
    SSL_KEY,
    KEYSTORE,
    SPARK_KEY,
)


def leaked(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def secret_settings(home: Path, port: int, pg_password: str = PG) -> dict[str, str]:
    """Settings whose every service is at ``port`` (nothing listens), with secrets."""
    return {
        "home": str(home),
        "postgres_url": f"postgresql+psycopg://app:{pg_password}@127.0.0.1:{port}/db",
        "views_read_url": f"postgresql+psycopg://reader:{READ_PG}@127.0.0.1:{port}/db",
        "redis_url": f"redis://:{REDIS}@127.0.0.1:{port}/0",
        "kafka_bootstrap_servers": f"127.0.0.1:{port}",
        "kafka_security_protocol": "SASL_SSL",
        "kafka_sasl_mechanism": "SCRAM-SHA-256",
        "kafka_sasl_username": "svc",
        "kafka_sasl_password": SASL,
        "kafka_ssl_key_password": SSL_KEY,
        "kafka_extra": f"ssl.keystore.password={KEYSTORE}",
        "spark_conf": f"spark.hadoop.fs.s3a.secret.key={SPARK_KEY}",
        "kafka_admin_timeout_s": "3",  # nothing listens: fail fast
        "api_token": COMMAND_TOKEN,
        "api_read_token": READ_TOKEN,
    }


def secret_env(home: Path, port: int, pg_password: str = PG) -> dict[str, str]:
    """The environment of a CLI run with :func:`secret_settings`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRIBUTARY_")}
    values = secret_settings(home, port, pg_password)
    return {
        **base,
        "TRIBUTARY_CONFIG_FILE": str(home / "absent.toml"),
        **{f"TRIBUTARY_{name.upper()}": value for name, value in values.items()},
    }


def cli(args: str, env: dict[str, str], **kwargs: object) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        [sys.executable, "-m", "infra.cli", *args.split()],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        **kwargs,  # type: ignore[call-overload]
    )
