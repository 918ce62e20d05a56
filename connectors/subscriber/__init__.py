"""The consumer SDK: ``subscribe`` to ``cdc.*`` and ``events.*`` topics and get typed records.

    from connectors.subscriber import subscribe

    with subscribe(["events.post"], "search-team", kafka=kafka) as subscriber:
        for delivery in subscriber:          # the previous record is processed when the
            handle(delivery.value)           # next is asked for: at-least-once

See ``docs/downstream.md``.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, overload

from connectors.kafka.config import ClientValue, KafkaConfig
from connectors.subscriber.errors import DeadLetterError, SubscriberError, UndecodableRecordError
from connectors.subscriber.policies import (
    DeadLetters,
    ErrorPolicy,
    Undecodable,
    dead_letter_topic,
    raise_undecodable,
    skip_undecodable,
)
from connectors.subscriber.records import Delivery, EventRecord, KafkaPosition, Reveal
from connectors.subscriber.subscriber import CommitMode, Start, Subscriber

E = TypeVar("E")

__all__ = [
    "CommitMode",
    "DeadLetterError",
    "DeadLetters",
    "Delivery",
    "ErrorPolicy",
    "EventRecord",
    "KafkaPosition",
    "Start",
    "Subscriber",
    "SubscriberError",
    "Undecodable",
    "UndecodableRecordError",
    "dead_letter_topic",
    "raise_undecodable",
    "skip_undecodable",
    "subscribe",
]


@overload
def subscribe(
    topics: Sequence[str],
    group_id: str | None,
    *,
    kafka: KafkaConfig,
    start: Start = ...,
    assign: bool = ...,
    on_error: ErrorPolicy | None = ...,
    dead_letter_topic: str | None = ...,
    commit: CommitMode = ...,
    commit_interval: float = ...,
    event_decoder: None = ...,
    properties: Mapping[str, ClientValue] | None = ...,
    schema_registry_url: str | None = ...,
    reveal: Reveal | None = ...,
) -> Subscriber[EventRecord]: ...


@overload
def subscribe(
    topics: Sequence[str],
    group_id: str | None,
    *,
    kafka: KafkaConfig,
    start: Start = ...,
    assign: bool = ...,
    on_error: ErrorPolicy | None = ...,
    dead_letter_topic: str | None = ...,
    commit: CommitMode = ...,
    commit_interval: float = ...,
    event_decoder: Callable[[EventRecord], E],
    properties: Mapping[str, ClientValue] | None = ...,
    schema_registry_url: str | None = ...,
    reveal: Reveal | None = ...,
) -> Subscriber[E]: ...


def subscribe(
    topics: Sequence[str],
    group_id: str | None,
    *,
    kafka: KafkaConfig,
    start: Start = "earliest",
    assign: bool = False,
    on_error: ErrorPolicy | None = None,
    dead_letter_topic: str | None = None,
    commit: CommitMode = "auto",
    commit_interval: float = 1.0,
    event_decoder: Callable[[EventRecord], Any] | None = None,
    properties: Mapping[str, ClientValue] | None = None,
    schema_registry_url: str | None = None,
    reveal: Reveal | None = None,
) -> Subscriber[Any]:
    """Subscribe to ``cdc.*`` and ``events.*`` topics (names, or ``^regex`` patterns in group
    mode).

    - ``group_id``: the consumer group; subscribers of one group share the partitions. With
      ``assign=True`` the subscriber reads every partition of ``topics`` (or exactly the
      partitions named by ``start`` positions) without joining the group — for replays; it
      commits to ``group_id`` only if one is given.
    - ``start``: ``"earliest"`` / ``"latest"`` for partitions the group has no commit for, or
      stored positions (the next record to read), which win over the group's commits once.
    - ``on_error``: called with a record that cannot be decoded; default :class:`DeadLetters`
      to ``dead_letter_topic`` or ``<topic>.dlq``, with the reason in a header.
    - ``commit``: ``"auto"`` (at-least-once: processed offsets committed within
      ``commit_interval`` seconds, on rebalance and on close) or ``"manual"``
      (:meth:`Subscriber.commit` only).
    - ``event_decoder``: turns an :class:`EventRecord` into the domain's event (see
      ``event_store.subscription.domain_events``); an exception there counts as undecodable.
    - ``properties``: extra librdkafka consumer properties (``session.timeout.ms``, ...).
    - ``schema_registry_url``: the registry ``events.*`` records' schema ids refer to (the
      local stack's, or ``TRIBUTARY_SCHEMA_REGISTRY_URL``); needed to read ``events.*``.
    - ``reveal``: decrypts personal fields (writer schema, data) -> data, e.g.
      ``event_store.personal.Revealer(KeyReader(dsn, schema))`` for a reader allowed to see
      personal data; without it they stay opaque tokens (bytes).
    """
    return Subscriber(
        topics,
        group_id,
        kafka=kafka,
        event_decoder=event_decoder or _as_published,
        start=start,
        assign=assign,
        on_error=on_error,
        dead_letter_topic=dead_letter_topic,
        commit=commit,
        commit_interval=commit_interval,
        properties=properties,
        schema_registry_url=schema_registry_url,
        reveal=reveal,
    )


def _as_published(record: EventRecord) -> EventRecord:
    return record
