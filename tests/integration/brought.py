"""The integration session on a Kafka and a PostgreSQL it did not start ("bring your own"):
what it takes from the environment, what it creates there and how it cleans up.

``TRIBUTARY_TEST_KAFKA_BOOTSTRAP_SERVERS`` and ``TRIBUTARY_TEST_POSTGRES_URL`` name them (both, or
neither); Kafka's security settings come as ``TRIBUTARY_TEST_KAFKA_*`` beside them (the names of
the ``TRIBUTARY_KAFKA_*`` settings with ``TEST_`` inserted). ``TRIBUTARY_TEST_REDIS_URL`` and
``TRIBUTARY_TEST_SCHEMA_REGISTRY_URL`` are optional: without them the session runs a Redis and a
schema registry of its own (the registry on the brought Kafka, on a topic of the session's own).

Each session has a tag (four letters g-z: never inside a hex id) and creates on the brought
services only what it can name:

- a database of its own, ``tributary_test_<tag>`` (the role of the URL needs CREATEDB, as the
  tests that make a database per test already do); every schema, table, publication and
  replication slot of the session lives in it and goes with it;
- topics: the tests' ``unique`` names start with the tag; the session's own settings name their
  fixed topics (commands, results, activity, schemas) with it.

At the end it drops the replication slots of its database, the database, and the topics that
did not exist when it began: those carrying its tag always, the others (made by a test under
a fixed name) only when no other session's database is there (another session may use them).
What it could not remove is printed.
"""

import os
import random
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

#: The settings of Kafka's security the session passes on: ``TRIBUTARY_TEST_<NAME>`` gives
#: ``TRIBUTARY_<NAME>`` (the field ``<name>`` of the settings).
KAFKA_SECURITY = (
    "KAFKA_SECURITY_PROTOCOL",
    "KAFKA_SASL_MECHANISM",
    "KAFKA_SASL_USERNAME",
    "KAFKA_SASL_PASSWORD",
    "KAFKA_SSL_CA_LOCATION",
    "KAFKA_SSL_CERTIFICATE_LOCATION",
    "KAFKA_SSL_KEY_LOCATION",
    "KAFKA_SSL_KEY_PASSWORD",
    "KAFKA_EXTRA",
)
DATABASE_PREFIX = "tributary_test_"
_TAG_LETTERS = "ghijklmnopqrstuvwxyz"  # no hex digit: a tag is never part of a uuid's hex


def brought(environ: "os._Environ[str] | dict[str, str]") -> dict[str, str] | None:
    """The brought services' variables (``TRIBUTARY_TEST_*`` without the prefix, lower case),
    or None when the session starts its own. Only one of Kafka and PostgreSQL is an error."""
    kafka = environ.get("TRIBUTARY_TEST_KAFKA_BOOTSTRAP_SERVERS")
    postgres = environ.get("TRIBUTARY_TEST_POSTGRES_URL")
    if not kafka and not postgres:
        return None
    if not (kafka and postgres):
        raise ValueError(
            "set both TRIBUTARY_TEST_KAFKA_BOOTSTRAP_SERVERS and TRIBUTARY_TEST_POSTGRES_URL"
            " (or neither: the session then starts a stack of its own)"
        )
    names = ("KAFKA_BOOTSTRAP_SERVERS", "POSTGRES_URL", "REDIS_URL", "SCHEMA_REGISTRY_URL")
    values = {}
    for name in (*names, *KAFKA_SECURITY):
        value = environ.get(f"TRIBUTARY_TEST_{name}")
        if value:
            values[name.lower()] = value
    return values


def new_tag() -> str:
    return "".join(random.SystemRandom().choice(_TAG_LETTERS) for _ in range(4))


def unique_name(tag: str | None, length: int = 10) -> str:
    """A short unique suffix; with a session tag, the tag and then hex digits."""
    import uuid

    digits = uuid.uuid4().hex
    return digits[:length] if tag is None else tag + digits[: max(length - len(tag), 6)]


def libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def with_database(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


@dataclass
class BroughtSession:
    """What one session made on the brought services, and its clean-up."""

    values: dict[str, str]
    tag: str = field(default_factory=new_tag)
    topics_before: set[str] = field(default_factory=set)

    @property
    def database(self) -> str:
        return f"{DATABASE_PREFIX}{self.tag}"

    @property
    def admin_dsn(self) -> str:
        return libpq(self.values["postgres_url"])

    @property
    def database_url(self) -> str:
        url = self.values["postgres_url"]
        if not url.startswith("postgresql+psycopg://"):
            url = "postgresql+psycopg://" + url.split("://", 1)[1]
        return with_database(url, self.database)

    def security(self) -> dict[str, str]:
        """Kafka's security settings, as settings fields."""
        own = "kafka_bootstrap_servers"
        return {k: v for k, v in self.values.items() if k.startswith("kafka_") and k != own}

    def settings_overrides(self) -> dict[str, Any]:
        """The session's settings on the brought services, its fixed names tagged."""
        t = self.tag
        return {
            "kafka_bootstrap_servers": self.values["kafka_bootstrap_servers"],
            "postgres_url": self.database_url,
            "redis_url": self.values.get("redis_url"),
            "schema_registry_url": self.values.get("schema_registry_url"),
            "schema_registry_topic": f"_schemas-{t}",
            "commands_topic": f"commands-{t}",
            "command_results_topic": f"command-results-{t}",
            "activity_topic": f"activity-{t}",
            "cdc_connector_name": f"tributary_{t}",
            "cdc_topic_prefix": f"cdc-{t}",
            "event_topic_prefix": f"events-{t}.",
            "analytics_topic_prefix": f"analytics-{t}.",
            **self.security(),
        }

    # -- set-up and clean-up ---------------------------------------------------------------

    def begin(self, topics: set[str]) -> None:
        self.topics_before = set(topics)
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))

    def other_sessions(self) -> list[str]:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s AND datname <> %s",
                (DATABASE_PREFIX.replace("_", r"\_") + "%", self.database),
            ).fetchall()
        return [r[0] for r in rows]

    def drop_database(self) -> list[str]:
        """Drop the session's replication slots, then its database; the slots dropped."""
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            slots = [
                r[0]
                for r in conn.execute(
                    "SELECT slot_name FROM pg_replication_slots WHERE database = %s",
                    (self.database,),
                ).fetchall()
            ]
            for slot in slots:
                conn.execute(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                    " WHERE slot_name = %s AND active_pid IS NOT NULL",
                    (slot,),
                )
                conn.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                    " WHERE slot_name = %s",
                    (slot,),
                )
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(self.database)
                )
            )
        return slots

    def topics_to_delete(self, topics_now: set[str], others: list[str]) -> list[str]:
        """The topics the session made: every new one, or only the tagged ones while another
        session is there."""
        new = topics_now - self.topics_before
        tag = re.escape(self.tag)
        # a test's unique name (the tag, then hex digits) or a fixed name of the session's own
        mine = re.compile(f"{tag}[0-9a-f]{{6}}|[-_.]{tag}([-_.]|$)")
        if others:
            return sorted(t for t in new if mine.search(t))
        return sorted(new)


def report(line: str) -> None:
    """A line about the session's brought services: appended to the file named by
    ``TRIBUTARY_TEST_BROUGHT_LOG`` (``make test-byo`` shows it), else to the real stderr (pytest
    captures a fixture's output)."""
    text = f"[brought services] {line}\n"
    log = os.environ.get("TRIBUTARY_TEST_BROUGHT_LOG")
    if log:
        with open(log, "a") as f:
            f.write(text)
    elif sys.__stderr__ is not None:
        sys.__stderr__.write(text)
