"""The activity stream: what a web front end writes straight to Kafka (not event-sourced).

Topic ``activity``, key = the front end's session id, value = one JSON object per event:

- ``search``: ``query`` (the text searched);
- ``click``: ``post_id`` clicked from a search's results, ``search_id`` (that search's event id)
  and ``search_time`` (when the search happened, by the same device clock);

each with ``event_id``, ``type``, ``session_id``, ``user_id`` and the three timestamps in ms since
the epoch: ``event_time`` and ``sent_time`` by the device's clock, ``received_time`` by the
server's clock (the front end stamps it when the event reaches it, then produces the record:
the log is in receive order per session).

:func:`generate` makes a workload with skewed device clocks, events held on the device (late,
within or beyond the allowed lateness) and searches followed by clicks; each event keeps its
true time (``true_time``, not written) so tests can check the correction.
:class:`ActivityProducer` writes events (and stamps ``received_time`` for live ones).
"""

import json
import random
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from connectors.kafka.config import KafkaConfig
from connectors.kafka.topics import history_topic

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
DEFAULT_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
WORDS = (
    "kafka",
    "spark",
    "debezium",
    "stream",
    "window",
    "watermark",
    "join",
    "ledger",
    "replay",
    "session",
)

Kind = Literal["search", "click"]


@dataclass(frozen=True)
class ActivityEvent:
    """One front-end event with its three timestamps (ms since the epoch)."""

    event_id: str
    type: Kind
    session_id: str
    user_id: int
    event_time: int  # device clock
    sent_time: int  # device clock
    received_time: int  # server clock
    query: str | None = None
    search_id: str | None = None
    search_time: int | None = None  # device clock, clicks only
    post_id: int | None = None
    true_time: int | None = field(default=None, compare=False)  # generated truth, not sent

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "event_id": self.event_id,
            "type": self.type,
            "session_id": self.session_id,
            "user_id": self.user_id,
            "event_time": self.event_time,
            "sent_time": self.sent_time,
            "received_time": self.received_time,
        }
        if self.type == "search":
            out["query"] = self.query
        else:
            out.update(search_id=self.search_id, search_time=self.search_time, post_id=self.post_id)
        return out

    def value(self) -> bytes:
        return json.dumps(self.as_dict(), separators=(",", ":")).encode()

    @property
    def key(self) -> bytes:
        return self.session_id.encode()


@dataclass(frozen=True)
class ActivityPlan:
    """What :func:`generate` makes: ``sessions`` front-end sessions of ``users`` users starting
    within ``span_ms`` after ``start_ms`` (server clock), device clocks off by up to
    ``skew_ms`` either way, and a share of events held on the device before sending: ``late``
    held up to ``allowed_ms`` (late, kept), ``beyond`` held longer (beyond the allowed
    lateness)."""

    sessions: int = 40
    users: int = 15
    start_ms: int = DEFAULT_START_MS
    span_ms: int = 2 * HOUR_MS
    searches: tuple[int, int] = (1, 6)  # per session
    clicks: tuple[int, int] = (0, 3)  # per search
    skew_ms: int = 10 * MINUTE_MS
    late: float = 0.06
    beyond: float = 0.03
    allowed_ms: int = 5 * MINUTE_MS
    long_gap: float = 0.15  # share of gaps between searches longer than a session gap
    seed: int = 7


def _held(rng: random.Random, plan: ActivityPlan) -> int:
    """How long the device holds an event before sending it."""
    roll = rng.random()
    if roll < plan.beyond:
        return plan.allowed_ms + rng.randrange(30_000, 2 * plan.allowed_ms + 30_001)
    if roll < plan.beyond + plan.late:
        return rng.randrange(20_000, max(20_001, plan.allowed_ms - 1_000))
    return rng.randrange(0, 1_500)


def _event(
    rng: random.Random,
    plan: ActivityPlan,
    kind: Kind,
    session: str,
    user: int,
    skew: int,
    true_time: int,
    **extra: Any,
) -> ActivityEvent:
    hold = _held(rng, plan)
    return ActivityEvent(
        event_id=str(uuid.UUID(int=rng.getrandbits(128))),
        type=kind,
        session_id=session,
        user_id=user,
        event_time=true_time + skew,
        sent_time=true_time + skew + hold,
        received_time=true_time + hold,  # network time taken as nil
        true_time=true_time,
        **extra,
    )


def generate(plan: ActivityPlan = ActivityPlan()) -> list[ActivityEvent]:
    """A workload in log order (the order the server received the events)."""
    rng = random.Random(plan.seed)
    events: list[ActivityEvent] = []
    for _ in range(plan.sessions):
        session = f"s-{rng.getrandbits(48):012x}"
        user = rng.randrange(1, plan.users + 1)
        skew = rng.randrange(-plan.skew_ms, plan.skew_ms + 1)
        at = plan.start_ms + rng.randrange(0, plan.span_ms)
        for _ in range(rng.randrange(plan.searches[0], plan.searches[1] + 1)):
            query = " ".join(rng.sample(WORDS, rng.choice((1, 1, 2))))
            search = _event(rng, plan, "search", session, user, skew, at, query=query)
            events.append(search)
            for _ in range(rng.randrange(plan.clicks[0], plan.clicks[1] + 1)):
                delay = rng.choice(
                    (rng.randrange(500, 60_000), rng.randrange(60_000, 40 * MINUTE_MS))
                )
                if rng.random() < 0.05:
                    delay = HOUR_MS + rng.randrange(1_000, 10 * MINUTE_MS)  # past the hour
                events.append(
                    _event(
                        rng,
                        plan,
                        "click",
                        session,
                        user,
                        skew,
                        at + delay,
                        search_id=search.event_id,
                        search_time=search.event_time,
                        post_id=rng.randrange(1, 200),
                    )
                )
            if rng.random() < plan.long_gap:
                at += rng.randrange(35 * MINUTE_MS, 70 * MINUTE_MS)
            else:
                at += rng.randrange(5_000, 12 * MINUTE_MS)
    return sorted(events, key=lambda e: (e.received_time, e.event_id))


def live(event: ActivityEvent, now_ms: int) -> ActivityEvent:
    """The event as the server receives it now (``received_time`` stamped)."""
    return replace(event, received_time=now_ms)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class ActivityProducer:
    """Writes activity events to the topic (created if absent), keyed by session id, placed
    as Java clients place keys (murmur2)."""

    def __init__(self, kafka: KafkaConfig, topic: str = "activity", partitions: int = 2) -> None:
        self.topic = topic
        from connectors.kafka import TopicAdmin  # the CLI starts without confluent-kafka
        from connectors.kafka.producing import idempotent_producer

        TopicAdmin(kafka).ensure(history_topic(topic, partitions))
        self.producer = idempotent_producer(kafka, {"linger.ms": 20}, java_placement=True)

    def send(self, events: Iterable[ActivityEvent]) -> int:
        count = 0
        for event in events:
            while True:
                try:
                    self.producer.produce(self.topic, key=event.key, value=event.value())
                    break
                except BufferError:
                    self.producer.poll(0.1)
            count += 1
            if count % 10_000 == 0:
                self.producer.poll(0)
        return count

    def search(
        self, session_id: str, user_id: int, query: str, *, skew_ms: int = 0, held_ms: int = 0
    ) -> ActivityEvent:
        """Send a search that happened ``held_ms`` ago on a device ``skew_ms`` off, received
        now."""
        return self._now("search", session_id, user_id, skew_ms, held_ms, query=query)

    def click(
        self,
        session_id: str,
        user_id: int,
        search_id: str,
        search_time: int,
        post_id: int,
        *,
        skew_ms: int = 0,
        held_ms: int = 0,
    ) -> ActivityEvent:
        """Send a click on ``post_id`` from the results of search ``search_id``."""
        return self._now(
            "click",
            session_id,
            user_id,
            skew_ms,
            held_ms,
            search_id=search_id,
            search_time=search_time,
            post_id=post_id,
        )

    def _now(
        self, kind: Kind, session: str, user: int, skew: int, held: int, **extra: Any
    ) -> ActivityEvent:
        received = now_ms()
        event = ActivityEvent(
            event_id=str(uuid.uuid4()),
            type=kind,
            session_id=session,
            user_id=user,
            event_time=received - held + skew,
            sent_time=received + skew,
            received_time=received,
            true_time=received - held,
            **extra,
        )
        self.send([event])
        self.flush()
        return event

    def flush(self, timeout: float = 60.0) -> None:
        left = self.producer.flush(timeout)
        if left:
            raise TimeoutError(f"{left} activity records not acknowledged in {timeout:g} s")


def batches(events: list[ActivityEvent], size: int) -> Iterator[list[ActivityEvent]]:
    for start in range(0, len(events), size):
        yield events[start : start + size]
