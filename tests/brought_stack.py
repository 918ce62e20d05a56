"""A Kafka and a PostgreSQL for the integration suite to be "brought" to (``make test-byo``):
a second local stack of only those two, in its own state folder on its own ports, started
apart from the suite, which then finds them through ``TRIBUTARY_TEST_*`` variables only.

    python -m tests.brought_stack up FOLDER      # start; writes FOLDER/env (shell exports)
    python -m tests.brought_stack check FOLDER   # what is on them beyond what `up` left
    python -m tests.brought_stack down FOLDER    # stop and delete

The broker is the same Tansu as the local stack's, in memory (``BYO_BROKER_STORAGE=s3`` for
SeaweedFS under it). It runs without SASL: this Tansu build cannot authenticate a client (its
memory and S3 engines keep no SCRAM credentials, and it offers no PLAIN); see docs/settings.md.
"""

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

from infra.settings import Settings
from infra.stack import LocalStack
from infra.stack.isolated import isolated_settings

SERVICES = ["postgres", "broker"]


def _settings(folder: Path) -> Settings:
    from infra.settings import load_settings

    recorded = json.loads((folder / "brought.json").read_text())
    return load_settings(**recorded)


def _env(settings: Settings) -> dict[str, str]:
    return {
        "TRIBUTARY_TEST_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{settings.broker_port}",
        "TRIBUTARY_TEST_POSTGRES_URL": (
            f"postgresql+psycopg://postgres@127.0.0.1:{settings.postgres_port}/tributary"
        ),
    }


def up(folder: Path) -> None:
    storage = os.environ.get("BYO_BROKER_STORAGE", "memory")
    settings = isolated_settings("tributary-brought-", broker_storage=storage)
    folder.mkdir(parents=True, exist_ok=True)
    recorded = {
        "home": str(settings.home),
        "broker_storage": storage,
        **{
            name: getattr(settings, name)
            for name in ("postgres_port", "broker_port", "objectstore_port")
        },
        "objectstore_internal_port": settings.objectstore_internal_port,
    }
    (folder / "brought.json").write_text(json.dumps(recorded))
    LocalStack(settings).up(SERVICES)
    env = _env(settings)
    (folder / "env").write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
    for key, value in env.items():
        print(f"{key}={value}")


def check(folder: Path) -> int:
    """What the brought services hold beyond a fresh start: databases, replication slots,
    roles and topics; 1 if anything."""
    import psycopg

    from connectors.kafka import KafkaConfig, TopicAdmin

    settings = _settings(folder)
    env = _env(settings)
    dsn = env["TRIBUTARY_TEST_POSTGRES_URL"].replace("+psycopg", "")
    with psycopg.connect(dsn) as conn:

        def names(query: str) -> list[str]:
            return [str(r[0]) for r in conn.execute(query)]  # type: ignore[arg-type]

        databases = names(
            "SELECT datname FROM pg_database WHERE datname NOT IN"
            " ('postgres', 'template0', 'template1', 'tributary') ORDER BY 1"
        )
        slots = names("SELECT slot_name FROM pg_replication_slots")
        roles = names("SELECT rolname FROM pg_roles WHERE rolname !~ '^pg_|^postgres$'")
        schemas = names(
            "SELECT nspname FROM pg_namespace WHERE nspname !~ '^pg_'"
            " AND nspname NOT IN ('public', 'information_schema')"
        )
        publications = names("SELECT pubname FROM pg_publication")
    admin = TopicAdmin(KafkaConfig(env["TRIBUTARY_TEST_KAFKA_BOOTSTRAP_SERVERS"], "byo-check"))
    topics = sorted(t for t in admin.topic_names() if not t.startswith("__"))
    found = {
        "databases": databases,
        "replication slots": slots,
        "roles": roles,
        "schemas in tributary": schemas,
        "publications in tributary": publications,
        "topics": topics,
    }
    left = {k: v for k, v in found.items() if v}
    print(json.dumps(left or "nothing left behind", indent=1))
    return 1 if left else 0


def down(folder: Path) -> None:
    if (folder / "brought.json").exists():
        settings = _settings(folder)
        LocalStack(settings).down(purge=True)
        shutil.rmtree(settings.home.parent, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("up", "check", "down"):
        print(__doc__, file=sys.stderr)
        return 2
    folder = Path(argv[1]).resolve()
    if argv[0] == "up":
        up(folder)
    elif argv[0] == "check":
        return check(folder)
    else:
        down(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
