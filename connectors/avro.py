"""Avro single-object encoding (fastavro) and the ``_tributary_fingerprints`` topic that names
every schema.

A single-object encoded value is ``C3 01`` + the schema's CRC-64-AVRO fingerprint (8 bytes,
little-endian) + the Avro binary body. Readers find the writer's schema by fingerprint in
``_tributary_fingerprints``: a compacted topic, key = the fingerprint (of the parsing canonical
form) as 16 hex digits, value = the full schema JSON (logical types and docs kept, which the
canonical form drops). Any Avro library that implements the spec can decode these values. (The
schema registry's ``_schemas`` topic, in Confluent's format, is another topic.)
"""

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

from connectors.errors import ConnectorError

MAGIC = b"\xc3\x01"
FINGERPRINTS_TOPIC = "_tributary_fingerprints"


class AvroDecodeError(ConnectorError):
    """A value is not single-object Avro, or its schema is unknown."""


@dataclass(frozen=True)
class AvroSchema:
    """A parsed schema with its canonical form and fingerprint."""

    definition: dict[str, Any]
    parsed: Any
    canonical: str
    fingerprint: bytes  # 8 bytes, little-endian as written in the values

    @property
    def document(self) -> str:
        """The schema as published: full JSON, so readers keep logical types."""
        return json.dumps(self.definition, separators=(",", ":"), sort_keys=True)

    @property
    def key(self) -> str:
        """The fingerprints topic's key: the fingerprint in hex (as the spec prints it,
        big-endian)."""
        return self.fingerprint[::-1].hex()

    @classmethod
    def of(cls, definition: Mapping[str, Any]) -> "AvroSchema":
        parsed = parse_schema(dict(definition))
        canonical = to_parsing_canonical_form(parsed)
        value = int(fingerprint(canonical, "CRC-64-AVRO"), 16)
        return cls(dict(definition), parsed, canonical, value.to_bytes(8, "little"))

    def encode(self, record: Mapping[str, Any]) -> bytes:
        out = io.BytesIO()
        out.write(MAGIC)
        out.write(self.fingerprint)
        schemaless_writer(out, self.parsed, dict(record))
        return out.getvalue()


def fingerprint_of(value: bytes) -> bytes:
    if len(value) < 10 or value[:2] != MAGIC:
        raise AvroDecodeError("not Avro single-object encoding (no C3 01 marker)")
    return value[2:10]


class SchemaCatalog:
    """Schemas by fingerprint, filled from ``_tributary_fingerprints`` records (or registered
    directly)."""

    def __init__(self) -> None:
        self._by_fingerprint: dict[bytes, AvroSchema] = {}

    def register(self, schema: AvroSchema) -> None:
        self._by_fingerprint[schema.fingerprint] = schema

    def add_record(self, key: bytes | None, value: bytes | None) -> None:
        """Take one fingerprints record (key = hex fingerprint, value = schema JSON)."""
        if value is None:
            return
        schema = AvroSchema.of(json.loads(value))
        if key is not None and key.decode() != schema.key:
            raise AvroDecodeError(
                f"{FINGERPRINTS_TOPIC} record {key!r} does not match its schema's fingerprint"
            )
        self.register(schema)

    def decode(self, value: bytes) -> dict[str, Any]:
        fp = fingerprint_of(value)
        schema = self._by_fingerprint.get(fp)
        if schema is None:
            raise AvroDecodeError(
                f"unknown schema fingerprint {fp[::-1].hex()}:"
                f" read it from {FINGERPRINTS_TOPIC} first"
            )
        record = schemaless_reader(io.BytesIO(value[10:]), schema.parsed, None)
        if not isinstance(record, dict):
            raise AvroDecodeError("an event value must be an Avro record")
        return record
