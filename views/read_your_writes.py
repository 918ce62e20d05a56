"""Read-your-writes: wait until every view that reads a command's topic has applied its events.

An accepted command's result carries a position token, ``<stream_type>/<stream_id>@<version>``.
The CDC publisher records in the event store's ``published_streams`` where each stream's latest
published event landed on Kafka (topic, partition, offset). A view has applied the token when

1. the stream's row has ``version >= token.version`` (else the event is not on Kafka yet), and
2. the view's store has committed, for the live generation, a next offset past that record's
   offset on its partition (stores keep the offsets they reached with the data, atomically).

Views that do not read ``events.<stream_type>`` are not waited for. A store that cannot be
reached counts as lagging, with the reason. :class:`ViewWaiter` is thread-safe: many waits may
run at once (an HTTP server's requests); PostgreSQL reads go through a small pool.
"""

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg import sql
from psycopg_pool import ConnectionPool

from projections.view import View
from tributary.view_model import Commit
from views.errors import InvalidPositionTokenError, ViewsLaggingError

__all__ = ["InvalidPositionTokenError", "PositionToken", "ViewWaiter", "ViewsLaggingError"]

EVENT_TOPIC_PREFIX = "events."


@dataclass(frozen=True)
class PositionToken:
    """A stream at a version: ``post/post-12@3`` (the stream id may hold ``/`` and ``@``)."""

    stream_type: str
    stream_id: str
    version: int

    @classmethod
    def parse(cls, text: str) -> "PositionToken":
        stream_type, slash, rest = text.partition("/")
        stream_id, at, version = rest.rpartition("@")
        if not (slash and at and stream_type and stream_id and version.isdigit()):
            raise InvalidPositionTokenError(
                f"{text!r} is not a position token: expected <stream_type>/<stream_id>@<version>"
                " as a command's result gives it (e.g. post/post-12@3)"
            )
        return cls(stream_type, stream_id, int(version))

    def topic(self, prefix: str = EVENT_TOPIC_PREFIX) -> str:
        """The topic the stream's events are published to."""
        return f"{prefix}{self.stream_type}"

    def __str__(self) -> str:
        return f"{self.stream_type}/{self.stream_id}@{self.version}"


@dataclass
class _CommitRead:
    """The last commit read of one view: concurrent waits share it (one read at a time)."""

    lock: threading.Lock
    generation: str | None = None
    commit: Commit | None = None
    started: float = -1.0


@dataclass(frozen=True)
class Landing:
    """Where the stream's latest published event is on Kafka, and its version."""

    version: int
    topic: str
    partition: int
    offset: int


@dataclass
class _Progress:
    """What one wait learned so far: the record to pass, and the views that passed it (a view
    that applied the token stays so: it is not asked again)."""

    landing: Landing | None = None
    done: set[str] = field(default_factory=set)


class ViewWaiter:
    """Answers which views have not applied a position token yet, and waits until none.

    ``generation_ttl_s``: a cached live generation older than this is read again when a view
    seems behind (a replay may have swapped a new generation in).
    """

    def __init__(
        self,
        views: Sequence[View],
        postgres_dsn: str,
        event_store_schema: str = "event_store",
        event_topic_prefix: str = EVENT_TOPIC_PREFIX,
        *,
        pool_size: int = 4,
        generation_ttl_s: float = 1.0,
    ) -> None:
        self.views = tuple(views)
        self.event_topic_prefix = event_topic_prefix
        self.generation_ttl_s = generation_ttl_s
        self._dsn = postgres_dsn
        self._pool_size = pool_size
        self._select = sql.SQL(
            'SELECT version, topic, partition, "offset" FROM {} WHERE stream_id = %s'
        ).format(sql.Identifier(event_store_schema, "published_streams"))
        self._table = f"{event_store_schema}.published_streams"
        self._lock = threading.Lock()
        self._pool: ConnectionPool[Any] | None = None
        self._generations: dict[str, tuple[str, float]] = {}  # view -> (generation, read at)
        self._commits: dict[str, _CommitRead] = {}

    # -- the public surface -------------------------------------------------------------

    def readers(self, token: PositionToken | str) -> list[View]:
        """The views that read the token's topic (the only ones waited for)."""
        topic = _token(token).topic(self.event_topic_prefix)
        return [v for v in self.views if topic in v.topics]

    def lagging(self, token: PositionToken | str) -> list[str]:
        """Names of the views reading the token's topic that have not applied it (raises
        nothing: a view whose store or whose position cannot be read counts as lagging)."""
        return list(self._check(_token(token), _Progress()))

    def wait(self, token: PositionToken | str, timeout: float = 30.0, poll_s: float = 0.05) -> None:
        """Return once every view reading the token's topic has applied it; raise
        :class:`ViewsLaggingError` naming the others after ``timeout`` seconds."""
        parsed = _token(token)
        deadline = time.monotonic() + timeout
        progress = _Progress()
        while True:
            lagging = self._check(parsed, progress)
            if not lagging:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise ViewsLaggingError(str(parsed), lagging, timeout)
            time.sleep(min(poll_s, left))

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> "ViewWaiter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one round of checks ------------------------------------------------------------

    def _check(self, token: PositionToken, progress: _Progress) -> dict[str, str]:
        """The views still lagging, with the reason; records progress made."""
        views = [v for v in self.readers(token) if v.name not in progress.done]
        if not views or token.version <= 0:  # version 0: the command wrote nothing
            return {}
        found = progress.landing
        if found is None:
            try:
                row = self._landing(token.stream_id)
            except Exception as exc:
                return dict.fromkeys((v.name for v in views), f"cannot read {self._table}: {exc}")
            if row is None or row.version < token.version:
                published = "nothing" if row is None else f"up to version {row.version}"
                unpublished = f"the event is not on Kafka yet (CDC published {published} of it)"
                return dict.fromkeys((v.name for v in views), unpublished)
            progress.landing = found = row
        lagging = {}
        for view in views:
            reason = self._behind(view, found)
            if reason is None:
                progress.done.add(view.name)
            else:
                lagging[view.name] = reason
        return lagging

    def _behind(self, view: View, at: Landing) -> str | None:
        """None when the view's live generation passed the record, else why not."""
        where = f"{at.topic}[{at.partition}]@{at.offset}"
        try:
            reached = self._reached(view, at)
        except Exception as exc:
            return f"its store cannot be reached: {exc}"
        if reached is not None and reached > at.offset:
            return None
        if reached is None:
            return f"has not applied {where} (the view has read nothing of the partition)"
        return f"has not applied {where} (the view reached offset {reached})"

    def _reached(self, view: View, at: Landing) -> int | None:
        """The next offset the view's live generation committed on the record's partition.

        The live generation is cached per view; it is read again when ``committed`` fails, and
        when the view seems behind and the cached value is older than ``generation_ttl_s``.
        """
        cached = self._cached(view)
        generation: str | None = cached[0] if cached is not None else self._generation(view)
        if generation is None:
            return None  # the view never ran
        try:
            commit = self._committed(view, generation)
        except Exception:
            generation = self._generation(view)
            if generation is None:
                return None
            commit = self._committed(view, generation)
            cached = None
        reached = commit.offsets.get(at.topic, {}).get(str(at.partition))
        behind = reached is None or reached <= at.offset
        if behind and cached is not None and time.monotonic() - cached[1] >= self.generation_ttl_s:
            live = self._generation(view)  # a replay may have swapped a new generation in
            if live is not None and live != generation:
                commit = self._committed(view, live)
                reached = commit.offsets.get(at.topic, {}).get(str(at.partition))
        return reached

    def _committed(self, view: View, generation: str) -> Commit:
        """The generation's commit as read by a read that started after this call began:
        waits running at once share one read per view instead of each asking the store."""
        asked = time.monotonic()
        with self._lock:
            read = self._commits.setdefault(view.name, _CommitRead(threading.Lock()))
        with read.lock:
            if read.generation == generation and read.commit is not None and read.started >= asked:
                return read.commit
            started = time.monotonic()
            commit = view.store.committed(generation)
            read.generation, read.commit, read.started = generation, commit, started
            return commit

    def _cached(self, view: View) -> tuple[str, float] | None:
        with self._lock:
            return self._generations.get(view.name)

    def _generation(self, view: View) -> str | None:
        """The view's live generation, read from its store (None: the view never ran; asking
        a store for the live generation of such a view would create one)."""
        if not view.store.generations():
            with self._lock:
                self._generations.pop(view.name, None)
            return None
        generation = view.store.live_generation()
        with self._lock:
            self._generations[view.name] = (generation, time.monotonic())
        return generation

    def _landing(self, stream_id: str) -> Landing | None:
        with self._connections().connection(timeout=10) as conn:
            row = conn.execute(self._select, (stream_id,)).fetchone()
        if row is None:
            return None
        return Landing(int(row[0]), str(row[1]), int(row[2]), int(row[3]))

    def _connections(self) -> "ConnectionPool[Any]":
        with self._lock:
            if self._pool is None:
                self._pool = ConnectionPool(
                    self._dsn,
                    min_size=1,
                    max_size=self._pool_size,
                    kwargs={"autocommit": True, "connect_timeout": 10},
                    open=False,
                    name="tributary-read-your-writes",
                )
                self._pool.open(wait=False)
            return self._pool


def _token(token: PositionToken | str) -> PositionToken:
    return token if isinstance(token, PositionToken) else PositionToken.parse(token)
