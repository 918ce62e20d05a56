"""Events read in bulk: encoded fields decode on use, and the event is any other event."""

import dataclasses
import pickle
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from event_store import Position, RecordedEvent, Upcasters
from event_store.event import POSTGRES_EPOCH
from event_store.reading import check_columns, event_from_row, selected_columns, upcast_all

WHEN = datetime(2026, 11, 21, 20, 0, 0, 123456, tzinfo=UTC)


def _row(event_type: str = "Opened", version: int = 1) -> tuple[object, ...]:
    """A row as the fast path loads it: id bytes, microseconds, JSON text."""
    micros = (WHEN - POSTGRES_EPOCH) // timedelta(microseconds=1)
    return (
        uuid.UUID(int=7).bytes,
        "acct-1",
        "acct",
        3,
        event_type,
        version,
        '{"n": 1, "tags": ["a"]}',
        '{"command_id": "c-1"}',
        micros,
        1234,
        56,
    )


def _eager(event_type: str = "Opened", version: int = 1) -> RecordedEvent:
    return RecordedEvent(
        uuid.UUID(int=7),
        "acct-1",
        "acct",
        3,
        event_type,
        version,
        {"n": 1, "tags": ["a"]},
        {"command_id": "c-1"},
        WHEN,
        Position(1234, 56),
    )


def test_a_bulk_read_event_equals_the_one_built_field_by_field() -> None:
    lazy = event_from_row(_row())
    assert lazy == _eager() and _eager() == lazy
    assert lazy.data == {"n": 1, "tags": ["a"]}
    assert lazy.position == Position(1234, 56)
    assert lazy.recorded_at == WHEN and lazy.recorded_at.utcoffset() == timedelta(0)
    assert repr(lazy) == repr(_eager())


def test_encoded_fields_decode_once_and_only_when_used() -> None:
    lazy = event_from_row(_row())
    assert "data" not in vars(lazy) and "position" not in vars(lazy)
    assert lazy.event_type == "Opened"  # a plain field: nothing decoded
    assert "data" not in vars(lazy)
    first = lazy.data
    assert lazy.data is first  # decoded once, then a plain attribute


def test_a_bulk_read_event_copies_pickles_and_replaces_like_any_other() -> None:
    lazy = event_from_row(_row())
    assert pickle.loads(pickle.dumps(lazy)) == _eager()
    assert dataclasses.asdict(lazy) == dataclasses.asdict(_eager())
    changed = dataclasses.replace(lazy, version=4)
    assert changed.version == 4 and changed.data == _eager().data
    with pytest.raises(dataclasses.FrozenInstanceError):
        lazy.data = {}  # type: ignore[misc]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        lazy.nope  # type: ignore[attr-defined]  # noqa: B018


def test_upcasting_looks_only_at_types_with_an_upcaster() -> None:
    upcasters = Upcasters()
    upcasters.register("Old", 1, "New", 2, lambda d: {**d, "n": d["n"] + 1})
    untouched = event_from_row(_row("Opened"))
    old = event_from_row(_row("Old", 1))
    events = upcast_all([untouched, old], upcasters)
    assert events[0] is untouched and "data" not in vars(untouched)  # never decoded
    assert (events[1].event_type, events[1].schema_version, events[1].data["n"]) == ("New", 2, 2)


def test_bulk_columns_are_checked_and_upcasting_selects_what_it_needs() -> None:
    assert check_columns(["data", "stream_id", "data"]) == ("data", "stream_id")
    with pytest.raises(ValueError, match="unknown columns"):
        check_columns(["data", "payload"])
    upcasters = Upcasters()
    upcasters.register("Old", 1, "New", 2)
    assert selected_columns(("stream_id",), upcasters) == ("stream_id",)
    assert selected_columns(("data",), upcasters) == ("data", "event_type", "schema_version")
    assert selected_columns(("data",), None) == ("data",)


def _page_events(count: int) -> list[RecordedEvent]:
    from event_store.reading import JsonPage, page_rows

    make = page_rows(JsonPage())
    events = []
    for n in range(count):
        row = list(_row())
        row[6] = f'{{"n": {n}, "tags": ["a"]}}'
        row[10] = n
        events.append(make(row))
    return events


def test_a_page_decodes_its_json_alone_or_ahead_in_a_scan_and_each_event_once() -> None:
    from event_store import reading

    events = _page_events(reading.JSON_BLOCK + 10)
    assert events[5].data == {"n": 5, "tags": ["a"]}  # alone: the others stay encoded
    page = vars(events[5])["_page"]
    assert [v is reading._UNDECODED for v in page._values["data"]].count(False) == 1
    assert [e.data["n"] for e in events] == list(range(len(events)))  # a scan
    assert all(e.data is e.data for e in events)
    assert events[3] == dataclasses.replace(
        _eager(), data={"n": 3, "tags": ["a"]}, position=Position(1234, 3)
    )
    assert events[7].metadata == {"command_id": "c-1"}


def test_an_event_of_a_page_pickles_without_its_page() -> None:
    events = _page_events(3)
    copied = pickle.loads(pickle.dumps(events[1]))
    assert "_page" not in vars(copied) and copied == events[1]
    assert len(pickle.dumps(events[1])) < 600
