"""How a library event becomes a row of the outbox: stream type, event type, version, data.

The ``eventsourcing`` library names an event by its *topic*, ``<module>:<qualified class
name>`` (``eventsourcing.tests.domain:BankAccount.TransactionAppended``). Tributary routes a row
to ``events.<stream_type>`` and labels it with an ``event_type``. Both come from the topic
string alone, so a consumer can predict them and they never depend on importing the code:

- ``stream_type``: the class that encloses the event class, in snake case
  (``BankAccount.TransactionAppended`` -> ``bank_account`` -> topic ``events.bank_account``).
  An event class with no enclosing class (a module-level event, a registered topic alias, a
  test's ``topic1``) belongs to the application: ``BankAccounts`` -> ``bank_accounts``.
- ``event_type``: the qualified class name (``BankAccount.TransactionAppended``); the full topic
  is kept in the row's metadata (``eventsourcing.topic``), which is how the library reads it
  back.
- ``version``: the library's ``originator_version`` + 1. The library lets an aggregate start at
  version 0; Tributary's stream versions start at 1. So the version on Kafka (header and
  ``_meta.version``) is one more than the aggregate's.
- ``schema_version``: the event's ``class_version`` (the library's upcasting counter, in the
  state when above 1), else 1.
"""

import json
import re
from dataclasses import dataclass
from functools import lru_cache

#: Stream type of events whose topic names no enclosing class and whose recorder has no
#: application name.
DEFAULT_STREAM_TYPE = "eventsourcing"

#: Tributary's ``events.version`` is an ``integer`` counting from 1.
MAX_ORIGINATOR_VERSION = 2**31 - 2

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NOT_NAME = re.compile(r"[^a-z0-9_]+")
# JSON that PostgreSQL's jsonb refuses (NUL) or keeps differently (escaped surrogates).
_JSONB_UNSAFE = re.compile(r"\\u0000|\\u[dD][89a-fA-F]")


def snake_case(name: str) -> str:
    """``BankAccount`` -> ``bank_account``, ``HTTPServer`` -> ``http_server``; anything that is
    not a letter, digit or underscore becomes ``_`` (a Kafka topic name stays valid)."""
    words = _CAMEL_BOUNDARY.sub("_", name.strip()).lower()
    return _NOT_NAME.sub("_", words).strip("_")


@dataclass(frozen=True)
class EventNaming:
    """Where and as what an event of one topic is stored."""

    stream_type: str
    event_type: str


@lru_cache(maxsize=4096)
def event_naming(topic: str, application: str) -> EventNaming:
    """The stream type and event type of events of ``topic`` recorded by ``application``."""
    _, colon, qualname = topic.partition(":")
    if not colon:
        qualname = topic
    names = qualname.split(".")
    owner = names[-2] if len(names) >= 2 else application
    stream_type = snake_case(owner) or snake_case(application) or DEFAULT_STREAM_TYPE
    return EventNaming(stream_type, qualname)


class _NotKept(ValueError):
    """A JSON value jsonb would not give back with the same meaning."""


def _refuse_constant(name: str) -> float:
    raise _NotKept(name)  # NaN, Infinity: not JSON, jsonb refuses them


def _kept_float(literal: str) -> float:
    # jsonb keeps a number as numeric and prints it without an exponent: "1e+16" would come
    # back as the integer 10000000000000000, "-0.0" as 0.0.
    value = float(literal)
    if "e" in literal or "E" in literal or (value == 0 and literal.startswith("-")):
        raise _NotKept(literal)
    return value


@dataclass(frozen=True)
class JsonState:
    """A state that is a JSON object: its text (stored as the row's ``data``) and the event's
    ``class_version``."""

    text: str
    class_version: int


def json_state(state: bytes) -> JsonState | None:
    """The state as a JSON object that PostgreSQL's jsonb keeps with the same meaning (keys
    may come back in another order, whitespace differs), or None: then the exact bytes are
    kept instead (a cipher's or compressor's output, another transcoder's, anything else)."""
    if state[:1] != b"{":
        return None
    try:
        text = state.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if _JSONB_UNSAFE.search(text):
        return None
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_kept_float)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    version = value.get("class_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version < 2**31:
        version = 1
    return JsonState(text, version)
