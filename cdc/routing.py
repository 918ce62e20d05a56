"""From a Debezium engine record to the Kafka record Tributary publishes."""

import json
from typing import Any

from cdc.errors import PublishError
from cdc.outbox import EventOutbox
from cdc.publisher import LSN_HEADER, TXID_HEADER, HeaderList, OutgoingChange
from event_store.outbox import EVENT_TOPIC_PREFIX, OutboxRegistry
from tributary.changes import position_of


def source_position(value: str) -> tuple[bytes, bytes | None]:
    """The ``source.lsn`` and ``source.txId`` of an envelope, as ASCII decimals.

    The envelope's ``source`` block follows ``before`` and ``after``, so scanning from its
    last occurrence avoids parsing the rows; a full parse is the fallback.
    """
    start = value.rfind('"source":{')
    if start >= 0:
        lsn = _number_after(value, '"lsn":', start)
        if lsn is not None:
            return lsn, _number_after(value, '"txId":', start)
    source: dict[str, Any] = json.loads(value).get("source") or {}
    lsn_value = position_of(source)
    if lsn_value is None:
        raise ValueError("change has no source.lsn nor source.sequence")
    tx = source.get("txId")
    return str(lsn_value).encode(), None if tx is None else str(tx).encode()


def _number_after(text: str, marker: str, start: int) -> bytes | None:
    at = text.find(marker, start)
    if at < 0:
        return None
    at += len(marker)
    end = at
    while end < len(text) and text[end].isdigit():
        end += 1
    return text[at:end].encode() if end > at else None


class ChangeRouter:
    """Turns (destination, key, value) into outgoing records, tracking the last position so a
    tombstone carries its delete's LSN. Changes of the outbox topic (the event store's table)
    become events on ``events.<stream_type>`` instead."""

    def __init__(
        self,
        skip_topics: frozenset[str] = frozenset(),
        unpositioned_topics: frozenset[str] = frozenset(),
        outbox_topic: str | None = None,
        event_topic_prefix: str = EVENT_TOPIC_PREFIX,
        registry: OutboxRegistry | None = None,
    ) -> None:
        self._skip = skip_topics
        self._unpositioned = unpositioned_topics
        self._outbox_topic = outbox_topic
        if outbox_topic is not None and registry is None:
            raise ValueError("routing the outbox table needs a schema registry")
        self._outbox = None if registry is None else EventOutbox(registry, event_topic_prefix)
        self._last: dict[tuple[str, str], HeaderList] = {}
        self.last_lsn: int | None = None

    def route(self, topic: str, key: str | None, value: str | None) -> list[OutgoingChange]:
        if topic in self._skip:
            return []
        key_bytes = None if key is None else key.encode()
        if value is None:
            if topic == self._outbox_topic:
                return []
            return [OutgoingChange(topic, key_bytes, None, self._last.pop((topic, key or ""), []))]
        if topic in self._unpositioned:  # heartbeats: no row, no position
            return [OutgoingChange(topic, key_bytes, value.encode(), [])]
        try:
            lsn, tx = source_position(value)
        except ValueError as exc:
            raise PublishError(f"{topic}: {exc}: {value[:300]}") from exc
        self.last_lsn = int(lsn)
        if topic == self._outbox_topic and self._outbox is not None:
            return self._outbox.route(value, lsn)
        headers: HeaderList = [(LSN_HEADER, lsn)]
        if tx is not None:
            headers.append((TXID_HEADER, tx))
        if '"op":"d"' in value[value.rfind('"source":{') :]:
            self._last[(topic, key or "")] = headers
        return [OutgoingChange(topic, key_bytes, value.encode(), headers)]
