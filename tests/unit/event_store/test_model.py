"""Events, positions, results and the registry: pure model behaviour."""

from dataclasses import FrozenInstanceError, dataclass
from datetime import UTC, datetime

import pytest

from event_store import (
    Accepted,
    Command,
    Event,
    EventCodec,
    EventRegistry,
    Position,
    RecordedEvent,
    Rejected,
    result_from_json,
)
from event_store.errors import EventDecodeError, UnknownEventTypeError


@dataclass(frozen=True)
class Opened(Event, name="AccountOpened", version=3):
    owner: str
    at: datetime
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Open(Command):
    owner: str


def _recorded(event_type: str, version: int, data: dict[str, object]) -> RecordedEvent:
    return RecordedEvent(
        event_id=__import__("uuid").uuid4(),
        stream_id="a-1",
        stream_type="account",
        version=1,
        event_type=event_type,
        schema_version=version,
        data=data,
        metadata={},
        recorded_at=datetime.now(UTC),
        position=Position(1, 1),
    )


def test_event_types_carry_name_and_schema_version_and_are_immutable() -> None:
    event = Opened("ann", datetime(2024, 1, 1, tzinfo=UTC))
    assert (Opened.event_name, Opened.schema_version) == ("AccountOpened", 3)
    assert (Open.command_name, Open("x").command_name) == ("Open", "Open")
    with pytest.raises(FrozenInstanceError):
        event.owner = "bob"  # type: ignore[misc]


def test_codec_round_trips_through_json() -> None:
    codec = EventCodec(EventRegistry([Opened]))
    event = Opened("ann", datetime(2024, 1, 1, 12, tzinfo=UTC), ("a", "b"))
    new = codec.encode(event, {"command_id": "c"})
    assert new.event_type == "AccountOpened" and new.schema_version == 3
    assert new.data == {"owner": "ann", "at": "2024-01-01T12:00:00Z", "tags": ["a", "b"]}
    assert codec.decode(_recorded(new.event_type, 3, new.data)) == event


def test_codec_refuses_unregistered_and_misshapen_events() -> None:
    codec = EventCodec(EventRegistry([Opened]))
    with pytest.raises(UnknownEventTypeError, match="register"):
        codec.decode(_recorded("AccountOpened", 2, {"owner": "x"}))
    with pytest.raises(EventDecodeError, match="upcaster"):
        codec.decode(_recorded("AccountOpened", 3, {"owner": "x"}))

    @dataclass(frozen=True)
    class Stray(Event):
        x: int

    with pytest.raises(UnknownEventTypeError):
        codec.encode(Stray(1))


def test_a_name_and_version_are_taken_once() -> None:
    @dataclass(frozen=True)
    class Impostor(Event, name="AccountOpened", version=3):
        owner: str

    with pytest.raises(ValueError, match="bump the schema version"):
        EventRegistry([Opened, Impostor])


def test_positions_order_by_transaction_then_sequence_and_parse_back() -> None:
    positions = [Position(5, 9), Position(4, 12), Position(5, 2)]
    assert sorted(positions) == [Position(4, 12), Position(5, 2), Position(5, 9)]
    assert Position.parse(str(Position(4, 12))) == Position(4, 12)
    with pytest.raises(ValueError, match="position"):
        Position.parse("nope")


def test_results_round_trip_through_json() -> None:
    accepted = Accepted("c", "s", "t", 3, ("e1", "e2"), Position(7, 8))
    rejected = Rejected("c", "no")
    assert result_from_json(accepted.to_json()) == accepted
    assert result_from_json(rejected.to_json()) == rejected
    with pytest.raises(ValueError):
        result_from_json({"status": "maybe"})
