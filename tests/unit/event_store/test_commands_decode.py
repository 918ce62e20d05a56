"""Decoding commands and command-topic envelopes: anything malformed is refused with a reason."""

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from event_store import CommandDecodeError, UnknownCommandTypeError
from event_store.command_topic import parse_envelope
from event_store.errors import MalformedCommandError
from event_store.snapshots import SnapshotPolicy
from examples.social import CreatePost, FollowUser, social_registry

REGISTRY = social_registry()


def test_valid_data_decodes_to_the_command() -> None:
    command = REGISTRY.decode("CreatePost", {"post_id": 1, "author_id": 2, "text": "hi"})
    assert command == CreatePost(1, 2, "hi")
    assert REGISTRY.decode("FollowUser", {"follower_id": 1, "followee_id": 2}) == FollowUser(1, 2)


@pytest.mark.parametrize(
    ("type_", "data", "needle"),
    [
        ("CreatePost", {"post_id": 1, "author_id": 2}, "text"),
        ("CreatePost", {"post_id": "1", "author_id": 2, "text": "x"}, "post_id"),
        ("CreatePost", {"post_id": True, "author_id": 2, "text": "x"}, "post_id"),
        ("CreatePost", {"post_id": 1, "author_id": 2, "text": "x", "extra": 1}, "extra"),
        ("CreatePost", [1], "JSON object"),
        ("Shout", {}, "unknown command type"),
        (3, {}, "string"),
    ],
)
def test_malformed_commands_are_refused_with_a_reason(type_: Any, data: Any, needle: str) -> None:
    with pytest.raises((CommandDecodeError, UnknownCommandTypeError), match=needle):
        REGISTRY.decode(type_, data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


@given(type_=json_values, data=json_values)
def test_decode_never_fails_any_other_way(type_: Any, data: Any) -> None:
    try:
        REGISTRY.decode(type_, data)
    except (CommandDecodeError, UnknownCommandTypeError) as exc:
        assert str(exc)


@given(st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()))
def test_envelope_parsing_refuses_garbage_with_a_reason(value: bytes) -> None:
    try:
        envelope = parse_envelope(value)
    except MalformedCommandError as exc:
        assert exc.reason
        return
    assert envelope.command_id and envelope.type and isinstance(envelope.data, dict)


def test_envelope_round_trip() -> None:
    raw = json.dumps({"command_id": "c1", "type": "DeletePost", "data": {"post_id": 1}}).encode()
    envelope = parse_envelope(raw)
    assert parse_envelope(envelope.to_json()) == envelope
    with pytest.raises(MalformedCommandError) as caught:
        parse_envelope(b'{"command_id": "c2", "type": "X", "data": 5}')
    assert caught.value.command_id == "c2"


@pytest.mark.parametrize(
    ("every", "old", "new", "due"),
    [
        (10, 0, 9, False),
        (10, 9, 10, True),
        (10, 8, 25, True),
        (10, 10, 19, False),
        (0, 0, 99, False),
    ],
)
def test_snapshot_policy(every: int, old: int, new: int, due: bool) -> None:
    assert SnapshotPolicy(every).due(old, new) is due
