"""The schema registry's operations, with Confluent's semantics and error codes.

Reads answer from the folded :class:`RegistryState`; a write first catches up with the log
(so ids and versions are assigned from everything written so far), checks, then appends the
record and waits until the log's reader has applied it. Schemas are Avro only.
"""

import json
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from fastavro import parse_schema
from fastavro.schema import to_parsing_canonical_form

from connectors.schema_registry.compat import (
    DEFAULT_LEVEL,
    LEVELS,
    SchemaStructureError,
    is_transitive,
    level_incompatibilities,
)
from connectors.schema_registry.errors import (
    IncompatibleSchemaError,
    InvalidCompatibilityLevelError,
    InvalidSchemaError,
    InvalidVersionError,
    SchemaNotFoundError,
    SubjectLevelNotConfiguredError,
    SubjectNotFoundError,
    SubjectNotSoftDeletedError,
    SubjectSoftDeletedError,
    VersionNotFoundError,
    VersionNotSoftDeletedError,
    VersionSoftDeletedError,
)
from connectors.schema_registry.records import (
    AVRO,
    RegistryState,
    SchemaVersion,
    config_key,
    config_value,
    delete_subject_key,
    delete_subject_value,
    schema_key,
)

MAX_VERSION = 2**31 - 1


class SchemaLog(Protocol):
    """Where the registry's records go (the compacted topic, or memory in tests)."""

    def append(self, key: bytes, value: bytes | None) -> None:
        """Write one record and return once the state has applied it."""

    def sync(self) -> None:
        """Return once the state has applied every record written so far."""


class MemoryLog:
    """A log in memory that applies each record at once (tests, tools)."""

    def __init__(self, state: RegistryState) -> None:
        self.state = state
        self.records: list[tuple[bytes, bytes | None]] = []

    def append(self, key: bytes, value: bytes | None) -> None:
        self.records.append((key, value))
        self.state.apply(key, value)

    def sync(self) -> None:
        return None


class ParsedSchema:
    """A submitted schema: its text as stored, its JSON, and the forms it is compared by."""

    def __init__(self, text: str, schema_type: str | None, references: Sequence[Any]) -> None:
        kind = (schema_type or AVRO).upper()
        if kind != AVRO:
            raise InvalidSchemaError(
                f"Invalid schema: schemaType {kind} is not supported by this registry;"
                " it stores Avro schemas only (omit schemaType or send AVRO)"
            )
        if references:
            raise InvalidSchemaError(
                "Invalid schema: schema references are not supported by this registry;"
                " inline the referenced types in the schema"
            )
        try:
            self.json: Any = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise InvalidSchemaError(f"Invalid schema: not JSON ({exc})") from exc
        try:
            parsed = parse_schema(self.json, _write_hint=False)
            self.canonical = to_parsing_canonical_form(parsed)
        except Exception as exc:  # fastavro raises several types for a bad schema
            raise InvalidSchemaError(f"Invalid schema: not a valid Avro schema ({exc})") from exc
        self.text = json.dumps(self.json, separators=(",", ":"))
        self.identity = json.dumps(self.json, separators=(",", ":"), sort_keys=True)

    def same_as(self, stored: str, normalize: bool = False) -> bool:
        try:
            other = json.loads(stored)
        except ValueError:
            return False
        if json.dumps(other, separators=(",", ":"), sort_keys=True) == self.identity:
            return True
        if not normalize:
            return False
        try:
            parsed = parse_schema(other, _write_hint=False)
            return bool(to_parsing_canonical_form(parsed) == self.canonical)
        except Exception:
            return False


def parse_version(version: str | int, allow_negative_latest: bool = True) -> int | None:
    """A version path segment: a number in [1, 2^31-1], ``latest`` or -1 (None: latest)."""
    text = str(version)
    if text == "latest" or (allow_negative_latest and text == "-1"):
        return None
    try:
        number = int(text)
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_VERSION:
        raise InvalidVersionError(
            f"The specified version '{text}' is not a valid version id. Allowed values are"
            f' between [1, {MAX_VERSION}] and the string "latest"'
        )
    return number


def check_level(level: str) -> str:
    upper = str(level).upper()
    if upper not in LEVELS:
        raise InvalidCompatibilityLevelError(
            "Invalid compatibility level. Valid values are none, backward, forward, full,"
            " backward_transitive, forward_transitive, and full_transitive"
        )
    return upper


class SchemaRegistry:
    """The registry over a state and the log that fills it."""

    def __init__(self, state: RegistryState, log: SchemaLog) -> None:
        self.state = state
        self.log = log
        self._write = threading.Lock()

    # -- reads ------------------------------------------------------------------------------

    def subject_names(self, deleted: bool = False) -> list[str]:
        with self.state.lock:
            return sorted(
                s
                for s, versions in self.state.subjects.items()
                if any(deleted or not v.deleted for v in versions.values())
            )

    def _versions(self, subject: str, deleted: bool = False) -> list[SchemaVersion]:
        with self.state.lock:
            found = self.state.subjects.get(subject, {})
            live = [v for _, v in sorted(found.items()) if deleted or not v.deleted]
        if not live:
            raise SubjectNotFoundError(f"Subject '{subject}' not found.")
        return live

    def version_numbers(self, subject: str, deleted: bool = False) -> list[int]:
        return [v.version for v in self._versions(subject, deleted)]

    def get_version(self, subject: str, version: str | int, deleted: bool = False) -> SchemaVersion:
        number = parse_version(version)
        versions = self._versions(subject, deleted)
        if number is None:
            return versions[-1]
        for entry in versions:
            if entry.version == number:
                return entry
        raise VersionNotFoundError(f"Version {number} not found.")

    def schema_by_id(self, schema_id: int) -> SchemaVersion:
        with self.state.lock:
            for versions in self.state.subjects.values():
                for entry in versions.values():
                    if entry.id == schema_id:
                        return entry
        raise SchemaNotFoundError(f"Schema {schema_id} not found")

    def versions_of_id(self, schema_id: int, deleted: bool = False) -> list[SchemaVersion]:
        self.schema_by_id(schema_id)
        with self.state.lock:
            return sorted(
                (
                    entry
                    for versions in self.state.subjects.values()
                    for entry in versions.values()
                    if entry.id == schema_id and (deleted or not entry.deleted)
                ),
                key=lambda e: (e.subject, e.version),
            )

    def lookup(
        self, subject: str, schema: ParsedSchema, normalize: bool = False, deleted: bool = False
    ) -> SchemaVersion:
        for entry in self._versions(subject, deleted):
            if schema.same_as(entry.schema, normalize):
                return entry
        raise SchemaNotFoundError("Schema not found")

    def level(self, subject: str | None = None) -> str:
        with self.state.lock:
            if subject is not None and subject in self.state.levels:
                return self.state.levels[subject]
            return self.state.levels.get(None, DEFAULT_LEVEL)

    def subject_level(self, subject: str, default_to_global: bool = False) -> str:
        with self.state.lock:
            if subject in self.state.levels:
                return self.state.levels[subject]
        if default_to_global:
            return self.level()
        raise SubjectLevelNotConfiguredError(
            f"Subject '{subject}' does not have subject-level compatibility configured"
        )

    # -- compatibility ----------------------------------------------------------------------

    def incompatibilities(
        self, subject: str, schema: ParsedSchema, against: Sequence[SchemaVersion]
    ) -> list[str]:
        """Confluent-style verbose messages: why ``schema`` breaks the subject's level against
        each of ``against`` (empty: compatible)."""
        level = self.level(subject)
        if level == "NONE":
            return []
        messages: list[str] = []
        for old in against:
            try:
                found = level_incompatibilities(level, schema.json, json.loads(old.schema))
            except SchemaStructureError as exc:
                raise InvalidSchemaError(f"Invalid schema: {exc}") from exc
            for problem in found:
                messages.append(
                    f"{{errorType:'{problem.kind}', description:'{problem.message}',"
                    f" path:'{problem.path}', oldSchemaVersion:{old.version}}}"
                )
            if found:
                messages.append(f"{{oldSchemaVersion: {old.version}}}")
                messages.append(f"{{oldSchema: '{old.schema}'}}")
        if messages:
            messages.append(f"{{compatibility: '{level}'}}")
        return messages

    def _checked_against(self, subject: str) -> list[SchemaVersion]:
        try:
            live = self._versions(subject)
        except SubjectNotFoundError:
            return []
        return live if is_transitive(self.level(subject)) else live[-1:]

    def test_compatibility(
        self, subject: str, schema: ParsedSchema, version: str | int | None
    ) -> list[str]:
        """Messages against one version (``latest`` on an empty subject: compatible), or,
        with ``version`` None, against what registering would check."""
        if version is None:
            return self.incompatibilities(subject, schema, self._checked_against(subject))
        number = parse_version(version)
        if number is None:
            try:
                latest = self._versions(subject)[-1]
            except SubjectNotFoundError:
                return []
            return self.incompatibilities(subject, schema, [latest])
        return self.incompatibilities(subject, schema, [self.get_version(subject, number)])

    # -- writes -----------------------------------------------------------------------------

    def register(self, subject: str, schema: ParsedSchema, normalize: bool = False) -> int:
        """The schema's id under ``subject``: the existing one when an identical schema is a
        live version of it, otherwise a new version (refused with 409 when incompatible)."""
        with self._write:
            self.log.sync()
            try:
                return self.lookup(subject, schema, normalize).id
            except (SubjectNotFoundError, SchemaNotFoundError):
                pass
            messages = self.incompatibilities(subject, schema, self._checked_against(subject))
            if messages:
                raise IncompatibleSchemaError(
                    f"Schema being registered is incompatible with an earlier schema for"
                    f' subject "{subject}", details: [{", ".join(messages)}]',
                    messages,
                )
            with self.state.lock:
                existing = self.state.subjects.get(subject, {})
                version = max(existing, default=0) + 1
                schema_id = self._id_for(schema, normalize)
            entry = SchemaVersion(subject, version, schema_id, schema.text)
            self.log.append(*entry.record())
            return schema_id

    def _id_for(self, schema: ParsedSchema, normalize: bool) -> int:
        """The id an identical schema already has in any subject, or the next one."""
        for versions in self.state.subjects.values():
            for entry in versions.values():
                if entry.schema_type == AVRO and schema.same_as(entry.schema, normalize):
                    return entry.id
        return self.state.max_id + 1

    def set_level(self, level: str, subject: str | None = None) -> str:
        checked = check_level(level)
        with self._write:
            self.log.append(config_key(subject), config_value(checked))
        return checked

    def delete_level(self, subject: str | None = None) -> str:
        """Remove a subject's level (or reset the global one); returns the level it had."""
        with self._write:
            self.log.sync()
            before = self.subject_level(subject) if subject is not None else self.level()
            self.log.append(config_key(subject), None)
        return before

    def delete_subject(self, subject: str, permanent: bool = False) -> list[int]:
        with self._write:
            self.log.sync()
            with self.state.lock:
                versions = dict(self.state.subjects.get(subject, {}))
            if not versions:
                raise SubjectNotFoundError(f"Subject '{subject}' not found.")
            live = [n for n, v in sorted(versions.items()) if not v.deleted]
            if not permanent:
                if not live:
                    raise SubjectSoftDeletedError(
                        f"Subject '{subject}' was soft deleted. Set permanent=true to delete"
                        " permanently"
                    )
                self.log.append(
                    delete_subject_key(subject), delete_subject_value(subject, max(versions))
                )
                return live
            if live:
                raise SubjectNotSoftDeletedError(
                    f"Subject '{subject}' was not deleted first before being permanently deleted"
                )
            for number in sorted(versions):
                self.log.append(schema_key(subject, number), None)
            self.log.append(delete_subject_key(subject), None)
            if subject in self.state.levels:
                self.log.append(config_key(subject), None)
            return sorted(versions)

    def delete_version(self, subject: str, version: str | int, permanent: bool = False) -> int:
        number = parse_version(version)
        with self._write:
            self.log.sync()
            with self.state.lock:
                versions = dict(self.state.subjects.get(subject, {}))
            if not any(not v.deleted for v in versions.values()) and not permanent:
                raise SubjectNotFoundError(f"Subject '{subject}' not found.")
            if not versions:
                raise SubjectNotFoundError(f"Subject '{subject}' not found.")
            if number is None:
                live = [n for n, v in versions.items() if not v.deleted]
                number = max(live or versions)
            entry = versions.get(number)
            if entry is None:
                raise VersionNotFoundError(f"Version {number} not found.")
            if not permanent:
                if entry.deleted:
                    raise VersionSoftDeletedError(
                        f"Subject '{subject}' Version {number} was soft deleted. Set"
                        " permanent=true to delete permanently"
                    )
                self.log.append(*replace(entry, deleted=True).record())
                return number
            if not entry.deleted:
                raise VersionNotSoftDeletedError(
                    f"Subject '{subject}' Version {number} was not deleted first before being"
                    " permanently deleted"
                )
            self.log.append(schema_key(subject, number), None)
            return number
