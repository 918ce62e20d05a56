"""Statements run on libpq directly: the hot path of the store and of the command bus.

psycopg's Python layer costs 40-50 µs of client CPU per statement on a 2-core machine
(cursor, query conversion, adapters, result set-up), several times what the database
spends on an ``INSERT``; at the libpq level the same prepared statement costs a few µs.
So the statements every command and every single-event append run go through here:

- a :class:`Statement` is prepared once per connection (``PQprepare``; its name is derived
  from its text) and executed by name, parameters in text (typed by the statement: cast
  where the context does not tell), results in binary;
- :func:`run` sends a batch (``BEGIN``, statements, ``COMMIT``) in one pipeline: one round
  trip. The first failure is raised as psycopg's own exception (``UniqueViolation``, …);
  the server skips the rest of the batch (the pipeline is aborted), so a ``COMMIT`` after
  a failed statement never runs. A single statement already prepared is sent outside
  pipeline mode (the same round trip, less client CPU). Waiting is a ``poll`` on the
  socket: other threads run.

This works under psycopg's feet on the same connection, between its statements, never
inside one; psycopg reads the transaction status from libpq, so a transaction opened here
is open for it too. When psycopg deallocates every prepared statement of a connection
(it does after a ``ROLLBACK`` it runs), the next batch fails with
:class:`StatementsLost` after forgetting them: the caller runs it again (they are prepared
anew), from the start of its transaction.
"""

import hashlib
import re
import select
import uuid
import weakref
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import psycopg
from psycopg import pq
from psycopg.adapt import Transformer

from event_store.errors import EventStoreError

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")
_STATUS = pq.ExecStatus
_OK = (_STATUS.COMMAND_OK, _STATUS.TUPLES_OK)
_BINARY = pq.Format.BINARY

#: SQLSTATEs of "prepared statement does not exist" and "... already exists".
_NOT_PREPARED = b"26000"
_DUPLICATE_PREPARED = b"42P05"


class StatementsLost(EventStoreError):
    """The server no longer has this connection's prepared statements (something ran
    ``DEALLOCATE ALL``): nothing of the batch ran after the failure; run it again."""


@dataclass(frozen=True)
class Statement:
    """A statement with ``%(name)s`` parameters, in the form libpq prepares (``$n``)."""

    name: bytes
    text: bytes
    params: tuple[str, ...]

    @staticmethod
    @lru_cache(maxsize=512)
    def of(sql: str) -> "Statement":
        """The statement for ``sql`` (a name used twice is the same parameter)."""
        params: list[str] = []

        def number(match: re.Match[str]) -> str:
            name = match.group(1)
            if name is None:
                return "%"
            if name not in params:
                params.append(name)
            return f"${params.index(name) + 1}"

        text = _PLACEHOLDER.sub(number, sql).encode()
        name = b"tributary_" + hashlib.blake2b(text, digest_size=10).hexdigest().encode()
        return Statement(name, text, tuple(params))


Step = tuple[Statement | bytes, Mapping[str, Any] | None]

# The statements prepared on each connection (keyed by the psycopg connection: it dies
# with it).
_prepared: "weakref.WeakKeyDictionary[psycopg.Connection[Any], set[bytes]]" = (
    weakref.WeakKeyDictionary()
)


def run(driver: psycopg.Connection[Any], *steps: Step) -> list[pq.abc.PGresult]:
    """Run ``steps`` in one pipeline and return one result per step.

    A step is a :class:`Statement` with its parameter values, or a plain command without
    parameters (``b"BEGIN"``). Raises psycopg's exception for the first step that failed
    (:class:`StatementsLost` when the server had forgotten a prepared statement).
    """
    pgconn = driver.pgconn
    known = _prepared.setdefault(driver, set())
    if len(steps) == 1:
        [(step, values)] = steps
        if isinstance(step, Statement) and step.name in known:
            return [_run_one(driver, known, step, values)]
    missing = {s.name: s for s, _ in steps if isinstance(s, Statement) and s.name not in known}
    # Every value is encoded before anything is sent: a value that cannot be (a NUL
    # character, a lone surrogate) fails the batch with the connection as it was.
    encoded = [
        (step, [encode(values[p]) for p in step.params] if values else None)
        if isinstance(step, Statement)
        else (step, None)
        for step, values in steps
    ]
    pgconn.enter_pipeline_mode()
    try:
        for statement in missing.values():
            pgconn.send_prepare(statement.name, statement.text)
        for step, args in encoded:
            if isinstance(step, bytes):
                pgconn.send_query_params(step, None, result_format=_BINARY)
            else:
                pgconn.send_query_prepared(step.name, args, result_format=_BINARY)
        pgconn.pipeline_sync()
        results = _until_sync(pgconn)
    finally:
        if pgconn.pipeline_status:
            # Fails only if interrupted with results pending: the connection is not reusable.
            with suppress(psycopg.Error):
                pgconn.exit_pipeline_mode()

    prepared, results = results[: len(missing)], results[len(missing) :]
    ok = {name for name, r in zip(missing, prepared, strict=True) if r.status in _OK}
    failed = [r for r in (*prepared, *results) if r.status not in _OK]
    if failed:
        state = failed[0].error_field(pq.DiagnosticField.SQLSTATE)
        if state == _NOT_PREPARED:  # all forgotten, but those this batch prepared
            known.clear()
        elif state == _DUPLICATE_PREPARED:  # there after all (a later run corrects us)
            ok.update(missing)
        known.update(ok)
        if state in (_NOT_PREPARED, _DUPLICATE_PREPARED):  # the rest of the batch never ran
            raise StatementsLost("the server's prepared statements changed: run again")
        raise psycopg.errors.error_from_result(failed[0], encoding=driver.info.encoding)
    known.update(ok)
    return results


def _run_one(
    driver: psycopg.Connection[Any],
    known: set[bytes],
    statement: Statement,
    values: Mapping[str, Any] | None,
) -> pq.abc.PGresult:
    """One statement already prepared on this connection, outside pipeline mode (a single
    statement gains nothing from it, and entering, syncing and leaving it cost more client
    CPU than the rest of a single-event append's call)."""
    args = [encode(values[p]) for p in statement.params] if values else None
    pgconn = driver.pgconn
    pgconn.send_query_prepared(statement.name, args, result_format=_BINARY)
    fileno = pgconn.socket
    poller = select.poll()
    poller.register(fileno, select.POLLIN | select.POLLOUT)
    while pgconn.flush():
        if any(event & select.POLLIN for _, event in poller.poll()):
            pgconn.consume_input()
    poller.modify(fileno, select.POLLIN)
    result: pq.abc.PGresult | None = None
    while True:
        while pgconn.is_busy():
            poller.poll()
            pgconn.consume_input()
        got = pgconn.get_result()
        if got is None:
            break
        result = got if result is None else result  # a statement has one result
    if result is None:
        raise psycopg.OperationalError("the server sent no result")
    if result.status not in _OK:
        if result.error_field(pq.DiagnosticField.SQLSTATE) == _NOT_PREPARED:
            known.clear()
            raise StatementsLost("the server's prepared statements changed: run again")
        raise psycopg.errors.error_from_result(result, encoding=driver.info.encoding)
    return result


def _until_sync(pgconn: pq.abc.PGconn) -> list[pq.abc.PGresult]:
    """Every result up to the pipeline's sync (excluded), waiting on the socket."""
    fileno = pgconn.socket
    poller = select.poll()
    poller.register(fileno, select.POLLIN | select.POLLOUT)
    while pgconn.flush():  # 1: more to send; read meanwhile so neither side blocks
        if any(event & select.POLLIN for _, event in poller.poll()):
            pgconn.consume_input()
    poller.modify(fileno, select.POLLIN)
    results: list[pq.abc.PGresult] = []
    while True:
        while pgconn.is_busy():
            poller.poll()
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:  # the end of one statement's results
            continue
        if result.status == _STATUS.PIPELINE_SYNC:
            return results
        results.append(result)  # PIPELINE_ABORTED for those after a failure


def encode(value: Any) -> bytes | None:
    """A parameter in PostgreSQL's text form.

    Raises :class:`psycopg.errors.CharacterNotInRepertoire` (SQLSTATE 22021, as the server
    would) for text PostgreSQL cannot hold: a NUL character (libpq sends a text parameter
    as a C string, so ``"a\\x00b"`` would silently arrive as ``"a"``) or a lone surrogate.
    """
    kind = type(value)
    if kind is str:
        return _text(value)
    if kind is int:
        return str(value).encode()
    if value is None:
        return None
    if kind is uuid.UUID:
        return value.hex.encode()  # type: ignore[no-any-return]  # 32 digits, also valid input
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, str | int | uuid.UUID):
        return _text(str(value))
    if isinstance(value, list | tuple):
        return _text(_array(value))
    raise TypeError(f"cannot send a {type(value).__name__} as a text parameter")


def _text(value: str) -> bytes:
    try:
        data = value.encode()
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end].encode("unicode_escape").decode()
        raise psycopg.errors.CharacterNotInRepertoire(
            f"text holds a lone surrogate ({bad}): not valid UTF-8"
        ) from None
    if b"\x00" in data:
        raise psycopg.errors.CharacterNotInRepertoire(
            "text holds a NUL character (\\x00): PostgreSQL text cannot store it"
        )
    return data


def _array(values: Sequence[Any]) -> str:
    """A one-dimensional array literal: every element quoted (backslash and double quote
    escaped), None as NULL."""
    items = []
    for value in values:
        if value is None:
            items.append("NULL")
            continue
        text = value.hex if type(value) is uuid.UUID else str(value)
        if "\\" in text or '"' in text:
            text = text.replace("\\", "\\\\").replace('"', '\\"')
        items.append(f'"{text}"')
    return "{" + ",".join(items) + "}"


def rows(result: pq.abc.PGresult) -> list[list[bytes | None]]:
    """A result's values as bytes (binary format), row by row."""
    value = result.get_value
    width = range(result.nfields)
    return [[value(r, c) for c in width] for r in range(result.ntuples)]


def int8(value: bytes | None) -> int:
    """A binary ``bigint``/``integer`` value."""
    if value is None:
        raise ValueError("unexpected NULL")
    return int.from_bytes(value, "big", signed=True)


def first_row(driver: psycopg.Connection[Any], result: pq.abc.PGresult) -> tuple[Any, ...] | None:
    """The first row of a result as Python values, by psycopg's loaders."""
    if result.ntuples == 0:
        return None
    transformer = Transformer(driver)
    transformer.set_pgresult(result)
    row: tuple[Any, ...] = transformer.load_row(0, tuple)
    return row
