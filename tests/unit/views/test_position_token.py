"""The position token: what an accepted command's result carries and what a waiter parses."""

import pytest

from event_store.command import Accepted, Rejected, result_from_json
from event_store.event import Position
from views.read_your_writes import (
    InvalidPositionTokenError,
    PositionToken,
    ViewsLaggingError,
)

ACCEPTED = Accepted("c1", "post-12", "post", 3, ("e1", "e2"), Position(7, 41))


def test_an_accepted_result_carries_its_token_and_a_rejected_one_none() -> None:
    data = ACCEPTED.to_json()
    assert data["position_token"] == "post/post-12@3"
    assert "position_token" not in Rejected("c2", "no such post").to_json()


def test_results_read_back_with_or_without_the_token() -> None:
    data = ACCEPTED.to_json()
    assert result_from_json(data) == ACCEPTED
    older = {k: v for k, v in data.items() if k != "position_token"}  # written before tokens
    assert result_from_json(older) == ACCEPTED
    assert result_from_json(older).position_token == "post/post-12@3"  # type: ignore[union-attr]


def test_parse_and_str_are_inverse() -> None:
    token = PositionToken.parse("post/post-12@3")
    assert token == PositionToken("post", "post-12", 3)
    assert str(token) == "post/post-12@3"
    assert PositionToken.parse(ACCEPTED.position_token) == token


def test_stream_ids_may_hold_slashes_and_at_signs() -> None:
    token = PositionToken("doc", "a/b@c", 12)
    assert PositionToken.parse(str(token)) == token


def test_the_topic_is_the_prefix_and_the_stream_type() -> None:
    token = PositionToken.parse("follows/follows-1@1")
    assert token.topic() == "events.follows"
    assert token.topic(prefix="prod.events.") == "prod.events.follows"


@pytest.mark.parametrize(
    "text", ["", "post", "post-12@3", "/post-12@3", "post/@3", "post/post-12", "post/p@x", "p/s@-1"]
)
def test_malformed_tokens_are_refused_with_the_expected_form(text: str) -> None:
    with pytest.raises(InvalidPositionTokenError, match="<stream_type>/<stream_id>@<version>"):
        PositionToken.parse(text)
    with pytest.raises(ValueError):
        PositionToken.parse(text)


def test_the_lagging_error_names_the_views_and_the_token() -> None:
    error = ViewsLaggingError(
        "post/post-12@3", {"timeline": "has not applied events.post[0]@5"}, 2.5
    )
    assert error.views == ["timeline"]
    assert error.token == "post/post-12@3"
    assert "timeline" in str(error) and "post/post-12@3" in str(error) and "2.5 s" in str(error)
