"""Whose fault a failure is: one command's, or the infrastructure's.

A command processor must never stop for good on one command: an exception caused by the
command's content fails again, identically, every time the command is read, so stopping
(and being restarted onto the same command) is a poison loop. Such an exception becomes
the command's rejection, recorded like any other. Only a failure of the infrastructure
(the database or the broker cannot be reached, a connection was lost, the schema is
missing) stops the processor: the command was not handled and must be read again later.

:func:`command_fault` draws the line:

- **the command's fault** — a handler raising anything but
  :class:`~event_store.errors.CommandRejected` (a ``ZeroDivisionError``, a ``KeyError``: the
  command hit a bug, which a redeploy fixes; a repeat of the command id keeps its answer); a
  PostgreSQL error of SQLSTATE class 22 (data exception: a NUL character in text or
  ``jsonb``, a number out of a column's range), 23 (integrity constraint violation) or 54
  (program limit exceeded: a value too large for an index row); the command's data or type
  not decoding;
- **not the command's fault** — connection and operational errors (``OperationalError``,
  ``InterfaceError``, ``OSError``), every other SQLSTATE class (08 connection, 40
  transaction rollback, 42 a statement's own error, 53 insufficient resources, 57 operator
  intervention, XX internal), a missing schema, broker errors, ``MemoryError``, and what
  is not an ``Exception`` at all (``KeyboardInterrupt``, ``SystemExit``). Concurrency
  conflicts are not the command's fault either: the bus retries them.
"""

import traceback

import psycopg
import sqlalchemy.exc
from confluent_kafka import KafkaException

from connectors.errors import ConnectorError
from event_store.errors import (
    CommandDecodeError,
    CommandRejected,
    EventStoreError,
    MalformedCommandError,
    SchemaMissingError,
    StorageError,
    UnknownCommandTypeError,
)

#: SQLSTATE classes of what PostgreSQL refuses for the values a statement was given, not
#: for its own state: 22 data exception, 23 integrity constraint violation, 54 program
#: limit exceeded. The same command fails the same way again, whatever the database's state.
DATA_SQLSTATE_CLASSES = frozenset({"22", "23", "54"})

_INFRASTRUCTURE = (MemoryError, OSError, KafkaException)

#: The longest reason a fault's rejection carries (an exception may quote huge values).
MAX_REASON_CHARS = 1_000


def command_fault(exc: BaseException) -> str | None:
    """The rejection reason when ``exc`` was caused by one command's content; None when it
    is a failure of the infrastructure (or a concurrency conflict), which must not be
    answered as the command's rejection."""
    if not isinstance(exc, Exception) or isinstance(exc, _INFRASTRUCTURE):
        return None
    if isinstance(exc, CommandRejected):
        return exc.reason
    if isinstance(exc, CommandDecodeError | UnknownCommandTypeError | MalformedCommandError):
        return str(exc)
    if isinstance(exc, StorageError):
        if isinstance(exc, SchemaMissingError):
            return None
        if data_sqlstate(exc.sqlstate):
            return _bounded(f"the database cannot store this command: {exc}")
        return None
    if isinstance(exc, EventStoreError | ConnectorError):
        return None  # conflicts, stored events that do not decode, Kafka, ...
    if isinstance(exc, sqlalchemy.exc.DBAPIError):
        return command_fault(exc.orig) if isinstance(exc.orig, BaseException) else None
    if isinstance(exc, sqlalchemy.exc.SQLAlchemyError):
        return None  # pool timeouts, closed connections
    if isinstance(exc, psycopg.Error):
        # A DataError raised by the client itself has no SQLSTATE (psycopg refusing NUL)
        if data_sqlstate(exc.sqlstate) or (
            exc.sqlstate is None and isinstance(exc, psycopg.DataError | psycopg.IntegrityError)
        ):
            state = "" if exc.sqlstate is None else f" [SQLSTATE {exc.sqlstate}]"
            return _bounded(f"the database cannot store this command: {exc}{state}")
        return None
    return _bounded(f"handling the command failed: {type(exc).__name__}: {exc}")


def data_sqlstate(sqlstate: str | None) -> bool:
    """Whether a SQLSTATE says the database refused a statement's values (see
    :data:`DATA_SQLSTATE_CLASSES`)."""
    return sqlstate is not None and sqlstate[:2] in DATA_SQLSTATE_CLASSES


def storable_text(text: str) -> str:
    """``text`` as PostgreSQL ``text`` and ``jsonb`` can hold it: each NUL character written
    ``\\x00`` and each lone surrogate ``\\udc00`` (backslash escapes), everything else
    unchanged. The mapping is not one-to-one: ``"c\\x00"`` and the six characters
    ``c\\x00`` become the same text."""
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode()
    return text.replace("\x00", "\\x00") if "\x00" in text else text


def brief(text: str, limit: int = 100) -> str:
    """``text`` for a log line: storable and at most ``limit`` characters (log records are
    redacted, which costs time on long texts, and a command id can be 20 kB)."""
    text = storable_text(text)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def traceback_of(exc: BaseException) -> str:
    """Where a handler's bug raised ``exc`` (its frames, not its message; the rejection's
    reason carries that, bounded); nothing for a database's refusal, where frames say
    nothing the SQLSTATE does not."""
    if isinstance(exc, EventStoreError | psycopg.Error | sqlalchemy.exc.SQLAlchemyError):
        return ""
    return "\n" + "".join(traceback.format_tb(exc.__traceback__))


def _bounded(reason: str) -> str:
    if len(reason) <= MAX_REASON_CHARS:
        return reason
    return f"{reason[:MAX_REASON_CHARS]}… ({len(reason) - MAX_REASON_CHARS} more characters)"
