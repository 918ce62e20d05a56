"""An event type in three versions, for the evolution tests: v2 adds an optional field (a
compatible change), v3 a required field without default (refused by the registry).

``registry()`` is a command-handlers factory (``TRIBUTARY_COMMAND_HANDLERS=
tests.integration.schema_registry.evolving:registry``) whose domain has the incompatible v3, in
the namespace ``EVOLVING_NAMESPACE`` names (one per test): the command processor must refuse to
start with it.
"""

import os
from dataclasses import dataclass
from datetime import datetime

from event_store import (
    Aggregate,
    Command,
    CommandRegistry,
    Event,
    EventCodec,
    EventRegistry,
    HandlerContext,
)


def rated_classes(namespace: str) -> tuple[type[Event], type[Event], type[Event]]:
    """``Rated`` v1, v2 (+ optional ``comment``) and v3 (+ required ``reviewer_id``)."""

    @dataclass(frozen=True)
    class RatedV1(Event, name="Rated", version=1, namespace=namespace):
        """A post was rated."""

        post_id: int
        stars: int
        rated_at: datetime

    @dataclass(frozen=True)
    class RatedV2(Event, name="Rated", version=2, namespace=namespace):
        """A post was rated, maybe with a comment."""

        post_id: int
        stars: int
        rated_at: datetime
        comment: str | None = None

    @dataclass(frozen=True)
    class RatedV3(Event, name="Rated", version=3, namespace=namespace):
        """A post was rated by a reviewer."""

        post_id: int
        stars: int
        rated_at: datetime
        reviewer_id: int
        comment: str | None = None

    return RatedV1, RatedV2, RatedV3


@dataclass(frozen=True)
class Rate(Command):
    post_id: int
    stars: int


class Rating(Aggregate[int]):
    stream_type = "rating"

    @classmethod
    def initial_state(cls) -> int:
        return 0

    @classmethod
    def evolve(cls, state: int, event: Event) -> int:
        return state + 1


def registry() -> CommandRegistry:
    """A domain whose only event type is the incompatible ``Rated`` v3."""
    _, _, rated_v3 = rated_classes(os.environ["EVOLVING_NAMESPACE"])
    commands = CommandRegistry(EventCodec(EventRegistry([rated_v3])))

    @commands.handler(Rate, Rating, stream=lambda c: f"rating-{c.post_id}")
    def rate(rating: Rating, c: Rate, ctx: HandlerContext) -> None:
        rating.record(rated_v3(c.post_id, c.stars, ctx.now, 1))  # type: ignore[call-arg]

    return commands
