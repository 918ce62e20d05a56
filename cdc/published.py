"""Where each stream's events landed on Kafka: the event store's ``published_streams``.

After a batch is acknowledged, the publisher hands the latest event of each stream to
:meth:`PublishedStreams.record`, which upserts the stream's version and the topic, partition and
offset of that record in one statement; a row only moves forward (a re-published, older
version changes nothing). Read-your-writes waits compare a view's offsets with these rows.

The table belongs to the event store's schema (``event_store.create_schema`` creates it); it
is not captured: the connector's publication lists only the configured tables.
"""

import time
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from cdc.errors import CdcError, PublishError
from cdc.publisher import PublishedEvent
from connectors.postgres import PostgresConfig

TABLE = "published_streams"

_UPSERT = """
INSERT INTO {table} AS p (stream_id, stream_type, version, topic, partition, "offset",
                          published_at)
SELECT s.stream_id, s.stream_type, s.version, s.topic, s.partition, s.record_offset, now()
FROM unnest(%(stream_ids)b::text[], %(stream_types)b::text[], %(versions)b::integer[],
            %(topics)b::text[], %(partitions)b::integer[], %(offsets)b::bigint[])
     AS s(stream_id, stream_type, version, topic, partition, record_offset)
ON CONFLICT (stream_id) DO UPDATE
   SET stream_type = EXCLUDED.stream_type, version = EXCLUDED.version,
       topic = EXCLUDED.topic, partition = EXCLUDED.partition, "offset" = EXCLUDED."offset",
       published_at = EXCLUDED.published_at
 WHERE p.version < EXCLUDED.version
"""


class PublishedStreams:
    """Upserts into ``<schema>.published_streams`` over one connection of its own (opened on
    first use, reopened after a failure). Used from the engine's thread only."""

    def __init__(self, database: PostgresConfig, schema: str, connect_timeout_s: int = 10) -> None:
        self.database = database
        self.schema = schema
        self.table = sql.Identifier(schema, TABLE)
        self._upsert = sql.SQL(_UPSERT).format(table=self.table)
        self._connect_timeout_s = connect_timeout_s
        self._conn: psycopg.Connection[Any] | None = None

    @property
    def name(self) -> str:
        return f"{self.schema}.{TABLE}"

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self.database.dsn, autocommit=True, connect_timeout=self._connect_timeout_s
            )
        return self._conn

    def check(self, wait_s: float = 60.0) -> None:
        """Wait (up to ``wait_s``) for the table: under `tributary run` the command processor
        creates the event store's schema while CDC starts. Then raise :class:`CdcError`
        saying what to do."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                row = self._connection().execute("SELECT to_regclass(%s)", (self.name,)).fetchone()
            except psycopg.Error as exc:
                self.close()
                raise CdcError(f"cannot check {self.name}: {exc}") from exc
            if (row is not None and row[0] is not None) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        if row is None or row[0] is None:
            raise CdcError(
                f"{self.name} does not exist: create the event store's tables with "
                "event_store.create_schema (`tributary run commands` does), then start CDC again"
            )

    def record(self, events: Sequence[PublishedEvent]) -> None:
        """Upsert each stream's version and record position (one event per stream)."""
        if not events:
            return
        ordered = sorted(events, key=lambda e: e.stream.stream_id)  # same lock order always
        params = {
            "stream_ids": [e.stream.stream_id for e in ordered],
            "stream_types": [e.stream.stream_type for e in ordered],
            "versions": [e.stream.version for e in ordered],
            "topics": [e.topic for e in ordered],
            "partitions": [e.partition for e in ordered],
            "offsets": [e.offset for e in ordered],
        }
        try:
            self._connection().execute(self._upsert, params)
        except psycopg.Error as exc:
            self.close()
            raise PublishError(
                f"cannot record the published versions of {len(ordered)} stream(s) in "
                f"{self.name}: {exc}; the connector stops without committing the batch"
            ) from exc

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
