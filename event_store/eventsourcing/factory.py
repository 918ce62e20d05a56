"""The library's infrastructure factory for Tributary's event store.

``PERSISTENCE_MODULE=event_store.eventsourcing`` selects it. Its settings are the library's own
and mean what they mean for the library's PostgreSQL module (it reads them with that module's
code): ``POSTGRES_DBNAME``, ``POSTGRES_HOST``, ``POSTGRES_PORT``, ``POSTGRES_USER``,
``POSTGRES_PASSWORD`` (or ``POSTGRES_GET_PASSWORD_TOPIC``), ``POSTGRES_CONNECT_TIMEOUT``,
``POSTGRES_POOL_SIZE``, ``POSTGRES_MAX_OVERFLOW``, ``POSTGRES_MAX_WAITING``,
``POSTGRES_CONN_MAX_AGE``, ``POSTGRES_PRE_PING``, ``POSTGRES_LOCK_TIMEOUT``,
``POSTGRES_IDLE_IN_TRANSACTION_SESSION_TIMEOUT``, ``ORIGINATOR_ID_TYPE``, ``CREATE_TABLE``, the
recorder topics, ``TRANSCODER_TOPIC``, ``CIPHER_TOPIC``/``CIPHER_KEY``, ``COMPRESSOR_TOPIC``,
``IS_SNAPSHOTTING_ENABLED``; each may be prefixed with the application's name
(``BANKACCOUNTS_POSTGRES_HOST``), as the library looks them up. Two differ:

- ``POSTGRES_SCHEMA`` names the event store schema, default ``event_store`` (Tributary's);
- ``POSTGRES_DSN`` (ours): a libpq connection string or URL (``postgresql://`` or
  ``postgresql+psycopg://``) giving the database, host, port, user and password not set one by
  one.

``SINGLE_ROW_TRACKING`` must stay true: the legacy multi-row tracking table is not offered.
"""

from typing import Any, cast

from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    InfrastructureFactory,
    ProcessRecorder,
)
from eventsourcing.postgres import BasePostgresFactory
from eventsourcing.utils import Environment, EnvType, resolve_topic, strtobool
from psycopg.conninfo import conninfo_to_dict

from event_store.eventsourcing.config import DEFAULT_APPLICATION, RecorderConfig
from event_store.eventsourcing.errors import EventsourcingSettingsError
from event_store.eventsourcing.recorders import (
    TributaryAggregateRecorder,
    TributaryApplicationRecorder,
    TributaryProcessRecorder,
    TributarySnapshotRecorder,
    TributaryTrackingRecorder,
)
from event_store.schema import DEFAULT_SCHEMA


class TributaryFactory(
    BasePostgresFactory[TributaryTrackingRecorder],
    InfrastructureFactory[TributaryTrackingRecorder],
):
    """Makes the recorders of one application (the environment's name) on the event store."""

    POSTGRES_DSN = "POSTGRES_DSN"

    aggregate_recorder_class = TributaryAggregateRecorder
    snapshot_recorder_class = TributarySnapshotRecorder
    application_recorder_class = TributaryApplicationRecorder
    tracking_recorder_class = TributaryTrackingRecorder
    process_recorder_class = TributaryProcessRecorder

    def __init__(self, env: Environment | EnvType | None) -> None:
        environment = env if isinstance(env, Environment) else Environment(env=env)
        fill_from_dsn(environment, environment.get(self.POSTGRES_DSN))
        super().__init__(environment)
        if not strtobool(self.env.get(self.POSTGRES_SINGLE_ROW_TRACKING, "t")):
            raise EventsourcingSettingsError(
                f"{self.POSTGRES_SINGLE_ROW_TRACKING} is false: Tributary's store keeps one "
                "tracking row per upstream application only; unset it"
            )
        self.recorder_config()  # refuse a bad schema name now, not at the first recorder

    def recorder_config(self) -> RecorderConfig:
        """Where and for whom the recorders made now record (the environment's name is the
        application's)."""
        schema = self.env.get(self.POSTGRES_SCHEMA) or DEFAULT_SCHEMA
        try:
            return RecorderConfig(
                schema=schema,
                application=self.env.name or DEFAULT_APPLICATION,
                originator_id_type=cast(Any, self.datastore.originator_id_type),
                lock_timeout=self.datastore.lock_timeout,
            )
        except ValueError as exc:
            raise EventsourcingSettingsError(
                f"{self.POSTGRES_SCHEMA}={schema!r}: {exc} (the event store schema)"
            ) from exc

    def _created(self, recorder: Any) -> Any:
        if self.env_create_table():
            recorder.create_table()
        return recorder

    def aggregate_recorder(self, purpose: str = "events") -> AggregateRecorder:
        """Events (``purpose="events"``) go to the outbox; anything else (snapshots) to the
        module's own table."""
        config = self.recorder_config()
        if purpose == "events":
            recorder: AggregateRecorder = type(self).aggregate_recorder_class(
                self.datastore, config
            )
        else:
            recorder = type(self).snapshot_recorder_class(self.datastore, config, purpose)
        return cast(AggregateRecorder, self._created(recorder))

    def application_recorder(self) -> ApplicationRecorder:
        topic = self.env.get(self.APPLICATION_RECORDER_TOPIC)
        cls: type[TributaryApplicationRecorder] = (
            resolve_topic(topic) if topic else type(self).application_recorder_class
        )
        _check_subclass(cls, TributaryApplicationRecorder, self.APPLICATION_RECORDER_TOPIC)
        return cast(ApplicationRecorder, self._created(cls(self.datastore, self.recorder_config())))

    def tracking_recorder(
        self, tracking_recorder_class: type[TributaryTrackingRecorder] | None = None
    ) -> TributaryTrackingRecorder:
        cls = tracking_recorder_class
        if cls is None:
            topic = self.env.get(self.TRACKING_RECORDER_TOPIC)
            cls = resolve_topic(topic) if topic else type(self).tracking_recorder_class
        _check_subclass(cls, TributaryTrackingRecorder, self.TRACKING_RECORDER_TOPIC)
        recorder = cls(self.datastore, self.recorder_config())
        return cast(TributaryTrackingRecorder, self._created(recorder))

    def process_recorder(self) -> ProcessRecorder:
        topic = self.env.get(self.PROCESS_RECORDER_TOPIC)
        cls: type[TributaryProcessRecorder] = (
            resolve_topic(topic) if topic else type(self).process_recorder_class
        )
        _check_subclass(cls, TributaryProcessRecorder, self.PROCESS_RECORDER_TOPIC)
        return cast(ProcessRecorder, self._created(cls(self.datastore, self.recorder_config())))


def _check_subclass(cls: object, base: type, setting: str) -> None:
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise EventsourcingSettingsError(f"{setting}: {cls!r} is not a {base.__name__}")


_DSN_PARTS = {
    "dbname": BasePostgresFactory.POSTGRES_DBNAME,
    "host": BasePostgresFactory.POSTGRES_HOST,
    "port": BasePostgresFactory.POSTGRES_PORT,
    "user": BasePostgresFactory.POSTGRES_USER,
    "password": BasePostgresFactory.POSTGRES_PASSWORD,
}


def fill_from_dsn(env: Environment, dsn: str | None) -> None:
    """Set in ``env`` the connection settings a DSN gives and ``env`` does not have (the ones
    set one by one win). A DSN without a password or host leaves them empty (libpq's
    defaults: no password, the local socket)."""
    if not dsn:
        return
    url = dsn.replace("postgresql+psycopg://", "postgresql://", 1)
    try:
        parts = conninfo_to_dict(url)
    except Exception as exc:  # psycopg.ProgrammingError; never echo the DSN (a password)
        raise EventsourcingSettingsError(
            f"POSTGRES_DSN is not a libpq connection string or URL: {type(exc).__name__}"
        ) from None
    for key, setting in _DSN_PARTS.items():
        if env.get(setting) is None:
            value = parts.get(key)
            env[setting] = "" if value is None else str(value)
