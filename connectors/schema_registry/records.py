"""The registry's records on its compacted topic, in Confluent's format, and their fold.

Keys and values are JSON, exactly as Confluent's registry writes them (so compaction replaces
the same key, and a registry of another vendor reading the topic understands them):

- ``{"keytype":"SCHEMA","subject":S,"version":V,"magic":1}`` →
  ``{"subject","version","id","schema","schemaType"?,"references"?,"deleted"}``;
  a tombstone deletes the version permanently;
- ``{"keytype":"CONFIG","subject":S|null,"magic":0}`` → ``{"compatibilityLevel":L}``
  (``null`` subject: the global level); a tombstone removes the subject's level;
- ``{"keytype":"DELETE_SUBJECT","subject":S,"magic":0}`` → ``{"subject":S,"version":V}``:
  versions up to V are soft-deleted;
- ``{"keytype":"NOOP","magic":0}`` → null: a marker a reader writes to find the log's end.

Records whose key is not such an object (another tool's records on the topic) are skipped.
"""

import json
import logging
import threading
from dataclasses import dataclass, replace
from typing import Any

log = logging.getLogger(__name__)

AVRO = "AVRO"


def _dump(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def schema_key(subject: str, version: int) -> bytes:
    return _dump({"keytype": "SCHEMA", "subject": subject, "version": version, "magic": 1})


def config_key(subject: str | None) -> bytes:
    return _dump({"keytype": "CONFIG", "subject": subject, "magic": 0})


def config_value(level: str) -> bytes:
    return _dump({"compatibilityLevel": level})


def delete_subject_key(subject: str) -> bytes:
    return _dump({"keytype": "DELETE_SUBJECT", "subject": subject, "magic": 0})


def delete_subject_value(subject: str, version: int) -> bytes:
    return _dump({"subject": subject, "version": version})


NOOP_KEY = _dump({"keytype": "NOOP", "magic": 0})


@dataclass(frozen=True)
class SchemaVersion:
    """One version of a subject: its global schema id and the schema text."""

    subject: str
    version: int
    id: int
    schema: str
    schema_type: str = AVRO
    references: tuple[dict[str, Any], ...] = ()
    deleted: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The REST form (``schemaType`` only when not Avro, as Confluent answers)."""
        out: dict[str, Any] = {
            "subject": self.subject,
            "version": self.version,
            "id": self.id,
            "schema": self.schema,
        }
        if self.schema_type != AVRO:
            out["schemaType"] = self.schema_type
        if self.references:
            out["references"] = list(self.references)
        return out

    def record(self) -> tuple[bytes, bytes]:
        """The topic record (key, value) of this version."""
        value = self.as_dict()
        value["deleted"] = self.deleted
        return schema_key(self.subject, self.version), _dump(value)


class RegistryState:
    """Subjects, versions, ids and levels folded from the topic's records, in order.

    ``lock`` guards every read and the fold: the reader thread applies records while requests
    read."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.subjects: dict[str, dict[int, SchemaVersion]] = {}
        self.levels: dict[str | None, str] = {}
        self.max_id = 0
        self.skipped = 0

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """Fold one record; a key that is not a registry key is counted and skipped."""
        parsed = _json(key)
        if not isinstance(parsed, dict) or not isinstance(parsed.get("keytype"), str):
            self._skip(key)
            return
        body = _json(value) if value is not None else None
        with self.lock:
            kind = parsed["keytype"]
            if kind == "SCHEMA":
                self._schema(parsed, body)
            elif kind == "CONFIG":
                subject = parsed.get("subject")
                if isinstance(body, dict) and isinstance(body.get("compatibilityLevel"), str):
                    self.levels[subject] = body["compatibilityLevel"]
                else:
                    self.levels.pop(subject, None)
            elif kind == "DELETE_SUBJECT" and isinstance(body, dict):
                self._delete_subject(str(body["subject"]), int(body["version"]))
            # NOOP, MODE and other key types carry nothing this registry keeps.

    def _schema(self, key: dict[str, Any], body: Any) -> None:
        subject, version = str(key["subject"]), int(key["version"])
        versions = self.subjects.setdefault(subject, {})
        if not isinstance(body, dict):
            versions.pop(version, None)
            if not versions:
                del self.subjects[subject]
            return
        entry = SchemaVersion(
            subject=subject,
            version=version,
            id=int(body["id"]),
            schema=str(body["schema"]),
            schema_type=str(body.get("schemaType") or AVRO),
            references=tuple(body.get("references") or ()),
            deleted=bool(body.get("deleted", False)),
        )
        versions[version] = entry
        self.max_id = max(self.max_id, entry.id)

    def _delete_subject(self, subject: str, up_to: int) -> None:
        versions = self.subjects.get(subject, {})
        for number, entry in list(versions.items()):
            if number <= up_to:
                versions[number] = replace(entry, deleted=True)

    def _skip(self, key: bytes | None) -> None:
        if self.skipped == 0:
            log.warning("skipping records that are not schema registry records (key %r)", key)
        self.skipped += 1


def _json(raw: bytes | None) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
