"""Upcasters: reshape and rename old events on read without touching history."""

from datetime import UTC, datetime
from uuid import uuid4

import pytest

from event_store import Position, RecordedEvent, Upcasters
from examples.social.domain import social_registry
from examples.social.posts import POST_UPCASTERS, PostCreated


def _stored(event_type: str, version: int, data: dict[str, object]) -> RecordedEvent:
    return RecordedEvent(
        uuid4(),
        "post-1",
        "post",
        1,
        event_type,
        version,
        data,
        {},
        datetime.now(UTC),
        Position(1, 1),
    )


def test_steps_chain_and_rename() -> None:
    upcasters = Upcasters()
    upcasters.register("Old", 1, "Old", 2, lambda d: {**d, "b": 0})
    upcasters.register("Old", 2, "New", 3)  # a pure rename
    result = upcasters.upcast(_stored("Old", 1, {"a": 1}))
    assert (result.event_type, result.schema_version, result.data) == ("New", 3, {"a": 1, "b": 0})
    current = _stored("New", 3, {"a": 1, "b": 0})
    assert upcasters.upcast(current) is current


def test_upcasting_leaves_the_stored_data_alone() -> None:
    upcasters = Upcasters()
    upcasters.register("Old", 1, "Old", 2, lambda d: d | {"b": 0})
    stored = _stored("Old", 1, {"a": 1})
    upcasters.upcast(stored)
    assert stored.data == {"a": 1}


def test_nonsense_registrations_are_refused() -> None:
    upcasters = Upcasters()
    with pytest.raises(ValueError, match="itself"):
        upcasters.register("A", 1, "A", 1)
    with pytest.raises(ValueError, match="backwards"):
        upcasters.register("A", 2, "A", 1)
    upcasters.register("A", 1, "B", 1)
    with pytest.raises(ValueError, match="already"):
        upcasters.register("A", 1, "C", 1)
    upcasters.register("B", 1, "A", 1)
    with pytest.raises(ValueError, match="loop"):
        upcasters.upcast(_stored("A", 1, {}))


def test_the_social_rename_from_post_published_v1() -> None:
    stored = _stored(
        "PostPublished",
        1,
        {
            "post_id": 1,
            "author_id": 2,
            "text": "#A b #c #a",
            "published_at": "2021-05-01T00:00:00Z",
        },
    )
    assert len(POST_UPCASTERS) == 1
    event = social_registry().codec.decode(stored)
    assert event == PostCreated(1, 2, "#A b #c #a", ("a", "c"), datetime(2021, 5, 1, tzinfo=UTC))
