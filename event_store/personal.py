"""Personal data encrypted per data subject (crypto-shredding).

An event type marks its personal fields with field metadata, naming the data subject the
value belongs to by another field of the same event::

    @dataclass(frozen=True)
    class PostCreated(Event, name="PostCreated", version=2):
        post_id: int
        author_id: int
        text: str = field(metadata=personal("user", "author_id"))

The codec stores and publishes such a field encrypted (AES-256-GCM) with the key of the
subject ``("user", str(author_id))``: in the events table's JSON and in the Kafka record
alike, the value is the text token ``tx1:<base64 of nonce + ciphertext + tag>`` (Avro type
``bytes``, with the field property ``tributary.personal``: subject, id field and the plain
value's Avro type). The associated data binds a token to its subject and field, so a token
copied into another subject's event does not decrypt. Envelope, ids and other fields stay
readable by anyone.

Keys live in ``<event store schema>.subject_keys`` (:mod:`event_store.schema`), one row per
subject, created the first time an event of that subject has a personal field. Forgetting
the subject (:mod:`event_store.forgetting`) sets the key to NULL: every copy of the
ciphertext, in the table, on ``events.*`` and in any replay, is unreadable from then on.

Readers decrypt with :func:`decrypt_data`; a value whose key is gone (or that does not
decrypt) reads as redacted: :data:`REDACTED_TEXT` (``"[forgotten]"``) for a string field,
None for any other type. It never raises.
"""

import base64
import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, ClassVar, Protocol

from event_store.errors import EventStoreError
from event_store.lru import Lru

#: The Avro field property of a personal field: ``{"subject", "id_field", "type"}``.
PERSONAL_PROPERTY = "tributary.personal"
TOKEN_PREFIX = "tx1:"
REDACTED_TEXT = "[forgotten]"
_NONCE = 12

Subject = tuple[str, str]  # (subject type, subject id as text)


class PersonalDataRejected(EventStoreError):
    """Personal data that cannot be written: the command is rejected, nothing stored."""


class SubjectForgottenError(PersonalDataRejected):
    """An event of a forgotten subject cannot be written: its key is gone."""


class UnstorableValueError(PersonalDataRejected):
    """A personal value the database could not store in plain either (a NUL character):
    refused as PostgreSQL refuses it in jsonb (SQLSTATE 22P05), though encrypted it would fit."""


@dataclass(frozen=True)
class Personal:
    """Where a personal field's subject is: its type and the event field holding its id."""

    subject: str
    id_field: str


def personal(subject: str, id_field: str, **metadata: Any) -> dict[str, Any]:
    """Field metadata marking a field personal data of ``(subject, event.<id_field>)``."""
    return {**metadata, "personal": Personal(subject, id_field)}


def personal_fields(cls: type[Any]) -> dict[str, Personal]:
    """The personal fields of an event class (field name -> where its subject is)."""
    if not is_dataclass(cls):
        return {}
    found = {f.name: f.metadata["personal"] for f in fields(cls) if "personal" in f.metadata}
    names = {f.name for f in fields(cls)}
    for name, mark in found.items():
        if not isinstance(mark, Personal) or mark.id_field not in names:
            raise EventStoreError(
                f"{cls.__qualname__}.{name}: personal(...) must name a field of the event"
            )
        if mark.id_field in found:
            raise EventStoreError(f"{cls.__qualname__}.{name}: a subject's id is not personal")
    return found


def personal_of_schema(definition: Mapping[str, Any]) -> dict[str, Personal]:
    """The personal fields of an Avro record schema, from their ``tributary.personal``
    property (what a reader with only the writer's schema knows)."""
    out: dict[str, Personal] = {}
    for f in definition.get("fields", ()):
        mark = f.get(PERSONAL_PROPERTY)
        if isinstance(mark, Mapping):
            out[str(f["name"])] = Personal(str(mark["subject"]), str(mark["id_field"]))
    return out


def new_key() -> bytes:
    return os.urandom(32)


def _aad(subject: Subject, field: str) -> bytes:
    return f"{subject[0]}\x00{subject[1]}\x00{field}".encode()


def encrypt(key: bytes, value: Any, subject: Subject, field: str) -> str:
    """The token of a JSON-ready ``value``."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(_NONCE)
    sealed = AESGCM(key).encrypt(nonce, json.dumps(value).encode(), _aad(subject, field))
    return TOKEN_PREFIX + base64.b64encode(nonce + sealed).decode()


def decrypt(key: bytes, token: str | bytes, subject: Subject, field: str) -> Any:
    """The JSON value of a token (raises on a wrong key or a damaged token)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    text = token.decode() if isinstance(token, bytes) else token
    if not text.startswith(TOKEN_PREFIX):
        raise ValueError("not a personal-data token")
    raw = base64.b64decode(text[len(TOKEN_PREFIX) :])
    plain = AESGCM(key).decrypt(raw[:_NONCE], raw[_NONCE:], _aad(subject, field))
    return json.loads(plain)


def subject_of(mark: Personal, data: Mapping[str, Any]) -> Subject | None:
    found = data.get(mark.id_field)
    return None if found is None else (mark.subject, str(found))


def subjects(marks: Mapping[str, Personal], data: Mapping[str, Any]) -> set[Subject]:
    """The subjects whose keys the personal fields of ``data`` need."""
    out = set()
    for name, mark in marks.items():
        subject = subject_of(mark, data)
        if subject is not None and data.get(name) is not None:
            out.add(subject)
    return out


class KeyStore(Protocol):
    """Writers' side: the key of a subject, created when it has none."""

    def key_for(self, subject: Subject) -> bytes: ...


def encrypt_data(
    marks: Mapping[str, Personal], data: Mapping[str, Any], keys: KeyStore
) -> dict[str, Any]:
    """JSON ``data`` with its personal fields replaced by their tokens (None stays None)."""
    out = dict(data)
    for name, mark in marks.items():
        subject = subject_of(mark, data)
        if subject is None or out.get(name) is None:
            continue
        if "\\u0000" in json.dumps(out[name]):
            raise UnstorableValueError(
                f"the database cannot store {name}: it holds a NUL character (\\u0000;"
                " 22P05, untranslatable character)"
            )
        out[name] = encrypt(keys.key_for(subject), out[name], subject, name)
    return out


def redacted(definition_type: Any) -> Any:
    """What a personal field whose key is gone reads as."""
    plain = definition_type
    if isinstance(plain, list):
        others = [t for t in plain if t != "null"]
        plain = others[0] if len(others) == 1 else None
    if isinstance(plain, Mapping):
        plain = plain.get("type")
    return REDACTED_TEXT if plain == "string" else None


def decrypt_data(
    marks: Mapping[str, Personal],
    data: Mapping[str, Any],
    keys: Mapping[Subject, bytes | None],
    plain_types: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``data`` with its personal fields decrypted; a field whose subject has no key in
    ``keys`` (forgotten, or never known) or that does not decrypt is redacted
    (:func:`redacted` of its plain type: ``plain_types[name]``, default string)."""
    out = dict(data)
    for name, mark in marks.items():
        token = out.get(name)
        if token is None:
            continue
        subject = subject_of(mark, data)
        key = None if subject is None else keys.get(subject)
        value: Any = None
        ok = False
        if key is not None and subject is not None:
            try:
                value, ok = decrypt(key, token, subject, name), True
            except Exception:  # a wrong key or a damaged token reads as redacted, never raises
                ok = False
        out[name] = value if ok else redacted((plain_types or {}).get(name, "string"))
    return out


def plain_types_of_schema(definition: Mapping[str, Any]) -> dict[str, Any]:
    """Each personal field's plain Avro type (from its property)."""
    return {
        str(f["name"]): f[PERSONAL_PROPERTY].get("type", "string")
        for f in definition.get("fields", ())
        if isinstance(f.get(PERSONAL_PROPERTY), Mapping)
    }


class MemoryKeys:
    """Keys in a dict (unit tests, a feed without a database): both sides."""

    def __init__(self) -> None:
        self.keys: dict[Subject, bytes | None] = {}

    def key_for(self, subject: Subject) -> bytes:
        if subject not in self.keys:
            self.keys[subject] = new_key()
        key = self.keys[subject]
        if key is None:
            raise SubjectForgottenError(f"{subject[0]} {subject[1]} was forgotten")
        return key

    def lookup(self, wanted: Iterable[Subject]) -> dict[Subject, bytes | None]:
        return {s: self.keys[s] for s in wanted if s in self.keys}

    def forget(self, subject: Subject) -> None:
        self.keys[subject] = None


class Revealer:
    """The consumer SDK's ``reveal`` (``connectors.subscriber.subscribe(..., reveal=...)``):
    an event's personal fields decrypted with the keys ``lookup`` returns (a
    :class:`KeyReader`'s or a :class:`MemoryKeys`'s), redacted where the key is gone."""

    def __init__(self, keys: Any) -> None:
        # a KeyReader or MemoryKeys (their lookup), or the lookup function itself
        self.lookup = getattr(keys, "lookup", keys)

    def __call__(self, definition: Mapping[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        marks = personal_of_schema(definition)
        if not marks:
            return data
        keys = self.lookup(subjects(marks, data))
        return decrypt_data(marks, data, keys, plain_types_of_schema(definition))


# -- the key table in PostgreSQL ---------------------------------------------------------


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _schema_name(schema: str) -> str:
    """``schema`` if it is a plain identifier (it is written into SQL), else a ValueError."""
    if not _IDENTIFIER.fullmatch(schema):
        raise ValueError(f"not a plain SQL identifier: {schema!r}")
    return schema


def key_for_sql(schema: str) -> str:
    """Get or create a subject's key in one statement (``%(t)s``, ``%(i)s``, ``%(k)s``): the
    existing row's key (NULL: forgotten), else the inserted one; no row at all when a
    concurrent writer inserted it meanwhile (run it again)."""
    schema = _schema_name(schema)
    return (
        f"WITH ins AS (INSERT INTO {schema}.subject_keys (subject_type, subject_id, key)"
        " VALUES (%(t)s, %(i)s, %(k)s) ON CONFLICT DO NOTHING RETURNING key, forgotten_at)"
        " SELECT key, forgotten_at FROM ins UNION ALL"
        f" SELECT key, forgotten_at FROM {schema}.subject_keys"
        " WHERE subject_type = %(t)s AND subject_id = %(i)s"
    )


def key_guard_sql(schema: str) -> str:
    """The statement that lets a writer use a key it cached (``%(t)s``, ``%(i)s``, and
    ``%(k)s``: the key in hex, as the bus's prepared statements take text parameters),
    run in the transaction that writes what the key encrypted, before its COMMIT: nothing
    when the subject's key is that key; else it inserts the key, which fails with a unique
    violation of ``subject_keys_pkey`` when the subject has another key or was forgotten
    (the writer then drops the key from its cache and runs the command again), and stores
    it when the subject has no row (a key cached from a transaction that rolled back: what
    it encrypted commits with it)."""
    schema = _schema_name(schema)
    return (
        f"INSERT INTO {schema}.subject_keys (subject_type, subject_id, key)"
        " SELECT %(t)s::text, %(i)s::text, decode(%(k)s::text, 'hex') WHERE NOT EXISTS"
        f" (SELECT 1 FROM {schema}.subject_keys WHERE subject_type = %(t)s::text"
        " AND subject_id = %(i)s::text AND key = decode(%(k)s::text, 'hex'))"
    )


#: The constraint a stale cached key violates in :func:`key_guard_sql`.
KEYS_PRIMARY_KEY = "subject_keys_pkey"


class KeyCache(Lru[Subject, bytes]):
    """Keys a writer found, by subject, the least recently used dropped first; thread-safe.
    A key from here is written only with :func:`key_guard_sql` in the same transaction: a
    subject forgotten since (its key set to NULL) fails the guard, never gets data written."""

    def __init__(self, size: int = 10_000) -> None:
        super().__init__(size)


class PgKeys:
    """A writer's keys through its own psycopg connection (the command's transaction: a key
    created for an event commits or rolls back with it). With a ``cache``, a key found before
    is used without a round trip; :attr:`guards` then lists the keys so used, and the writer
    runs :func:`key_guard_sql` for each in the same transaction (a forgotten subject's key is
    never written with again)."""

    def __init__(self, connection: Any, schema: str, cache: KeyCache | None = None) -> None:
        self.connection = connection
        self.sql = key_for_sql(schema)
        self.cache = cache
        self.guards: list[tuple[Subject, bytes]] = []  # cached keys used by this unit of work
        self._found: dict[Subject, bytes] = {}  # this unit of work only

    def key_for(self, subject: Subject) -> bytes:
        found = self._found.get(subject)
        if found is not None:
            return found
        cached = None if self.cache is None else self.cache.get(subject)
        if cached is not None:
            self._found[subject] = cached
            self.guards.append((subject, cached))
            return cached
        for _ in range(3):
            row = self.connection.execute(  # not prepared: the bus prepares its own
                self.sql, {"t": subject[0], "i": subject[1], "k": new_key()}, prepare=False
            ).fetchone()
            if row is None:
                continue
            if row[0] is None:
                raise SubjectForgottenError(
                    f"{subject[0]} {subject[1]} was forgotten: no personal data of it is written"
                )
            self._found[subject] = bytes(row[0])
            if self.cache is not None:
                self.cache.put(subject, self._found[subject])
            return self._found[subject]
        raise EventStoreError(f"no key for {subject[0]} {subject[1]}")


class KeyReader:
    """Readers' side: the keys of the subjects a batch needs, from the key table at ``dsn``
    (one query per call; a process keeps one connection). Never cached across calls: a
    forget takes effect at the next batch."""

    _connections: ClassVar[dict[str, Any]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn, self.schema = dsn, _schema_name(schema)

    def lookup(self, wanted: Iterable[Subject]) -> dict[Subject, bytes | None]:
        """Key per subject found (None: forgotten); a subject with no row is left out."""
        import psycopg

        pairs = sorted(set(wanted))
        if not pairs:
            return {}
        query = (
            f"SELECT subject_type, subject_id, key FROM {self.schema}.subject_keys"
            " WHERE (subject_type, subject_id) IN (SELECT * FROM unnest(%s::text[], %s::text[]))"
        )
        params = ([p[0] for p in pairs], [p[1] for p in pairs])
        with self._lock:
            for attempt in (1, 2):
                conn = self._connections.get(self.dsn)
                try:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
                        self._connections[self.dsn] = conn
                    rows = conn.execute(query, params).fetchall()
                    break
                except psycopg.errors.UndefinedTable:
                    return {}
                except psycopg.OperationalError:
                    self._connections.pop(self.dsn, None)
                    if attempt == 2:
                        raise
        return {(str(t), str(i)): None if k is None else bytes(k) for t, i, k in rows}

    def forgotten(self, subject_type: str | None = None) -> set[Subject]:
        """Every forgotten subject (of one type)."""
        import psycopg

        with psycopg.connect(self.dsn, connect_timeout=10) as conn:
            try:
                rows = conn.execute(
                    f"SELECT subject_type, subject_id FROM {self.schema}.subject_keys"
                    " WHERE forgotten_at IS NOT NULL"
                    + ("" if subject_type is None else " AND subject_type = %s"),
                    () if subject_type is None else (subject_type,),
                ).fetchall()
            except psycopg.errors.UndefinedTable:
                return set()
        return {(str(t), str(i)) for t, i in rows}


__all__ = [
    "KEYS_PRIMARY_KEY",
    "PERSONAL_PROPERTY",
    "REDACTED_TEXT",
    "KeyCache",
    "KeyReader",
    "KeyStore",
    "MemoryKeys",
    "Personal",
    "PgKeys",
    "Revealer",
    "Subject",
    "SubjectForgottenError",
    "decrypt",
    "decrypt_data",
    "encrypt",
    "encrypt_data",
    "key_guard_sql",
    "personal",
    "personal_fields",
    "personal_of_schema",
    "plain_types_of_schema",
    "subjects",
]
