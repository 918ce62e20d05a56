"""The change-event model: a Debezium record decoded from Kafka.

Lives in the shared kernel (``tributary``) so every layer may decode changes: CDC writes them,
the views and the consumer SDK read them; ``cdc`` re-exports it.
Wire format (``converter.schemas.enable=false``): key = JSON object of the primary-key
columns; value = the Debezium envelope ``{"op", "before", "after", "source", "ts_ms"}``;
a delete is followed by a tombstone (same key, null value). Headers ``lsn`` and ``txId``
carry the source position as ASCII decimals.
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tributary.errors import TributaryError

Op = Literal["c", "u", "d", "r", "t", "m"]
Row = dict[str, Any]
Headers = Sequence[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None

LSN_HEADER = "lsn"
TXID_HEADER = "txId"


class ChangeDecodeError(TributaryError):
    """A record is not a Debezium change event (wrong JSON, missing fields)."""


@dataclass(frozen=True)
class SourcePosition:
    """Where a change sits in the WAL: LSN (grows per key) and transaction id."""

    lsn: int
    tx_id: int | None
    ts_ms: int | None
    schema: str
    table: str
    snapshot: bool


@dataclass(frozen=True)
class ChangeEvent:
    """One change of one row, or a tombstone (``op is None``: value was null)."""

    topic: str
    key: Row
    op: Op | None
    before: Row | None
    after: Row | None
    source: SourcePosition | None

    @property
    def is_tombstone(self) -> bool:
        return self.op is None

    @property
    def position(self) -> int:
        """The LSN, for per-key position guards (a tombstone carries its delete's LSN)."""
        if self.source is None:
            raise ChangeDecodeError(
                f"{self.topic}: a tombstone without an lsn header has no position"
            )
        return self.source.lsn

    @property
    def row(self) -> Row | None:
        """The row's state after this change (None after a delete or for a tombstone)."""
        return self.after

    @property
    def is_delete(self) -> bool:
        return self.op == "d" or self.op is None

    @classmethod
    def from_kafka(
        cls, topic: str, key: bytes | None, value: bytes | None, headers: Headers = None
    ) -> "ChangeEvent":
        """Decode a record; raises :class:`ChangeDecodeError` saying what is wrong."""
        if key is None:
            raise ChangeDecodeError(f"{topic}: change without a key (tables need a primary key)")
        parsed_key = _json_object(topic, "key", key)
        if value is None:
            try:
                return cls(topic, parsed_key, None, None, None, _position_from_headers(headers))
            except ValueError as exc:
                raise ChangeDecodeError(f"{topic}: tombstone's lsn header: {exc}") from exc
        envelope = _json_object(topic, "value", value)
        if "payload" in envelope and "schema" in envelope:
            envelope = envelope["payload"]  # schemas.enable=true envelopes
            if not isinstance(envelope, dict):
                raise ChangeDecodeError(f"{topic}: value's payload is not a JSON object")
        op = envelope.get("op")
        if op not in ("c", "u", "d", "r", "t", "m"):
            raise ChangeDecodeError(f"{topic}: envelope has no valid op (got {op!r:.80})")
        before, after = envelope.get("before"), envelope.get("after")
        for name, row in (("before", before), ("after", after)):
            if row is not None and not isinstance(row, dict):
                raise ChangeDecodeError(f"{topic}: envelope's {name} is not a JSON object")
        source = envelope.get("source")
        if not isinstance(source, dict):
            raise ChangeDecodeError(f"{topic}: envelope has no source.lsn")
        try:
            lsn = position_of(source)
            tx_id = None if source.get("txId") is None else _integer(source["txId"])
        except (TypeError, ValueError) as exc:
            raise ChangeDecodeError(f"{topic}: envelope's source: {exc}") from exc
        if lsn is None:
            raise ChangeDecodeError(f"{topic}: envelope has no source.lsn")
        ts_ms = source.get("ts_ms")
        position = SourcePosition(
            lsn=lsn,
            tx_id=tx_id,
            ts_ms=ts_ms if isinstance(ts_ms, int) and not isinstance(ts_ms, bool) else None,
            schema=str(source.get("schema", "")),
            table=str(source.get("table", "")),
            snapshot=str(source.get("snapshot", "false")) not in ("false", "False"),
        )
        return cls(topic, parsed_key, op, before, after, position)


def position_of(source: Mapping[str, Any]) -> int | None:
    """A change's position: ``source.lsn``; for incremental-snapshot reads, which carry no LSN,
    the larger LSN of ``source.sequence`` (``[lastCommitLsn, lsn]``: where streaming stood when
    the chunk was read)."""
    if source.get("lsn") is not None:
        return _integer(source["lsn"])
    sequence = source.get("sequence")
    if isinstance(sequence, str):
        try:
            sequence = json.loads(sequence)
        except json.JSONDecodeError:
            return None
    if isinstance(sequence, list):
        known = [_integer(x) for x in sequence if x is not None]
        return max(known) if known else None
    return None


def _integer(value: Any) -> int:
    """An integer field of an envelope (Debezium writes LSNs, Java longs, as numbers or decimal
    strings); ValueError for anything else (booleans, fractions, objects, beyond 64 bits)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{value!r:.40} is not an integer")
    number = int(value)
    if not -(2**63) <= number < 2**63:
        raise ValueError(f"{number} is beyond a 64-bit integer")
    return number


def _json_object(topic: str, what: str, raw: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ChangeDecodeError(f"{topic}: {what} is not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ChangeDecodeError(f"{topic}: {what} is not a JSON object")
    if "payload" in parsed and "schema" in parsed and what == "key":
        payload = parsed["payload"]
        if isinstance(payload, dict):
            return payload
    return parsed


def _header(headers: Headers, name: str) -> bytes | None:
    if headers is None:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    for key, value in items:
        if key == name:
            return value
    return None


def _position_from_headers(headers: Headers) -> SourcePosition | None:
    lsn = _header(headers, LSN_HEADER)
    if lsn is None:
        return None
    tx = _header(headers, TXID_HEADER)
    return SourcePosition(int(lsn), int(tx) if tx else None, None, "", "", False)
