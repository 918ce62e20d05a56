"""An asyncio path to the event store: appends and reads on psycopg's async connections.

Same statements and guarantees as :class:`~event_store.store.EventStore` (it reuses
:class:`~event_store.store.AppendStatements` and :mod:`event_store.reading`), so async
services can append and follow the log without a thread per request::

    async with AsyncEventStore(PostgresConfig(url)) as store:
        await store.append("post-1", [NewEvent(...)], 0, stream_type="post")
        events = await store.read_all(after=None, limit=100)

Pass ``connection`` (a ``psycopg.AsyncConnection`` in a transaction) to append together
with other writes; without it each append is one autocommitted statement.
"""

from collections.abc import Sequence
from types import TracebackType
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from connectors.postgres import PostgresConfig
from event_store.errors import ConcurrencyError, SchemaMissingError, StorageError
from event_store.event import NewEvent, Position, RecordedEvent
from event_store.reading import (
    EventQueries,
    event_rows,
    page_params,
    raw_loaders,
    stream_params,
    upcast_all,
)
from event_store.schema import DEFAULT_SCHEMA, check_identifier
from event_store.store import AppendResult, AppendStatements
from event_store.upcasting import Upcasters


class AsyncEventStore:
    """Append to and read from one store schema with asyncio (psycopg async pool)."""

    def __init__(
        self,
        config: PostgresConfig,
        schema: str = DEFAULT_SCHEMA,
        upcasters: Upcasters | None = None,
    ) -> None:
        self.schema = check_identifier(schema)
        self.upcasters = upcasters
        self._sql = AppendStatements(schema)
        self._pool = AsyncConnectionPool(
            config.dsn,
            min_size=1,
            max_size=config.pool_size,
            kwargs={"autocommit": True},
            open=False,
        )
        events = f"{self.schema}.events"
        self._queries = EventQueries(self.schema)
        self._version = (
            f"SELECT coalesce(max(version), 0) FROM {events} WHERE stream_id = %(stream_id)s"
        )

    async def open(self) -> None:
        await self._pool.open(wait=True)

    async def close(self) -> None:
        await self._pool.close()

    async def __aenter__(self) -> "AsyncEventStore":
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def append(
        self,
        stream_id: str,
        events: Sequence[NewEvent],
        expected_version: int,
        *,
        stream_type: str,
        connection: psycopg.AsyncConnection[Any] | None = None,
    ) -> AppendResult:
        """As :meth:`EventStore.append`: atomic, :class:`ConcurrencyError` on a lost race."""
        if expected_version < 0:
            raise ValueError(f"expected_version must be >= 0, got {expected_version}")
        if not events:
            return AppendResult(stream_id, expected_version, (), ())
        params, statement = self._sql.for_append(stream_id, stream_type, events, expected_version)
        try:
            rows = await self._fetch(statement, params, connection)
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name == "events_stream_version_key":
                raise ConcurrencyError(stream_id, expected_version, None) from exc
            raise StorageError(f"append to {stream_id!r} failed: {exc}", exc.sqlstate) from exc
        if not rows:
            actual = None if connection is not None else await self.stream_version(stream_id)
            raise ConcurrencyError(stream_id, expected_version, actual)
        return AppendResult.of(stream_id, events, expected_version, rows)

    async def stream_version(self, stream_id: str) -> int:
        rows = await self._fetch(self._version, {"stream_id": stream_id}, None)
        return int(rows[0][0])

    async def read_stream(
        self, stream_id: str, from_version: int = 1, to_version: int | None = None
    ) -> list[RecordedEvent]:
        """As :meth:`EventStore.read_stream` (events decoded on use, upcast)."""
        params = stream_params(stream_id, from_version, to_version)
        return await self._events(self._queries.read_stream, params)

    async def read_all(
        self, after: Position | None = None, limit: int = 1000
    ) -> list[RecordedEvent]:
        """As :meth:`EventStore.read_all`: never skips an event that commits later."""
        return await self._events(self._queries.read_all, page_params(after, limit), True)

    async def _events(
        self, statement: str, params: dict[str, Any], in_index_order: bool = False
    ) -> list[RecordedEvent]:
        """The events of a ``reading.SELECT_EVENT`` statement, built as the sync store does;
        ``in_index_order``: a ``read_all`` page, planned without sorts (``reading._NO_SORT``),
        in a transaction of its own (one pipeline: one round trip)."""
        try:
            async with (
                self._pool.connection() as conn,
                conn.cursor(binary=True, row_factory=event_rows) as cursor,
            ):
                raw_loaders(cursor)
                if in_index_order:
                    async with conn.pipeline(), conn.transaction():
                        await cursor.execute("SET LOCAL enable_sort = off")
                        await cursor.execute(statement, params)
                        events = await cursor.fetchall()
                else:
                    await cursor.execute(statement, params)
                    events = await cursor.fetchall()
        except psycopg.errors.UndefinedTable as exc:
            raise SchemaMissingError(
                f"{self.schema}.events does not exist: create it with event_store.create_schema",
                exc.sqlstate,
            ) from exc
        except psycopg.Error as exc:
            raise StorageError(f"event store statement failed: {exc}", exc.sqlstate) from exc
        return upcast_all(events, self.upcasters)

    async def _fetch(
        self,
        statement: str,
        params: dict[str, Any],
        connection: psycopg.AsyncConnection[Any] | None,
    ) -> list[Any]:
        try:
            if connection is not None:
                async with connection.cursor() as cursor:
                    await cursor.execute(statement, params)
                    return await cursor.fetchall()
            async with self._pool.connection() as conn, conn.cursor() as cursor:
                await cursor.execute(statement, params)
                return await cursor.fetchall()
        except psycopg.errors.UndefinedTable as exc:
            raise SchemaMissingError(
                f"{self.schema}.events does not exist: create it with event_store.create_schema",
                exc.sqlstate,
            ) from exc
        except psycopg.errors.UniqueViolation:
            raise
        except psycopg.Error as exc:
            raise StorageError(f"event store statement failed: {exc}", exc.sqlstate) from exc
