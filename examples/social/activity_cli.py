"""The demo domain's CLI plug-in: ``tributary activity …`` writes the raw activity stream.

``activity generate`` writes a generated workload (skewed device clocks, events held on the
device, stragglers beyond the allowed lateness) to the activity topic; ``activity search`` and
``activity click`` send one event received now, as a web front end would. The CLI adds it
because ``TRIBUTARY_CLI_PLUGINS`` names it (``examples.social.activity_cli:activity_app``).
"""

import json
import sys
from typing import Annotated, Any

import typer

from examples.social.activity import (
    MINUTE_MS,
    ActivityPlan,
    ActivityProducer,
    generate,
    now_ms,
)
from infra.cli_app import fail, settings
from tributary.errors import TributaryError

__all__ = ["activity_app"]

activity_app = typer.Typer(
    name="activity",
    help="Write the raw activity stream (searches and clicks with three timestamps).",
    no_args_is_help=True,
)


def _producer() -> Any:
    s = settings()
    return ActivityProducer(s.kafka("tributary-activity"), s.activity_topic)


def _print(value: Any) -> None:
    sys.stdout.write(json.dumps(value, separators=(",", ":")) + "\n")
    sys.stdout.flush()


@activity_app.command("generate")
def activity_generate(
    sessions: Annotated[int, typer.Option(min=1, help="Front-end sessions.")] = 40,
    users: Annotated[int, typer.Option(min=1, help="Distinct users.")] = 15,
    span_minutes: Annotated[
        int, typer.Option(min=1, help="Sessions start within this many minutes.")
    ] = 120,
    skew_minutes: Annotated[
        int, typer.Option(min=0, help="Device clocks are off by up to this many minutes.")
    ] = 10,
    seed: Annotated[int, typer.Option(help="Seed of the generator (same seed, same events).")] = 7,
    start_ms: Annotated[
        int | None,
        typer.Option(help="Server time of the first session (ms; default: span minutes ago)."),
    ] = None,
) -> None:
    """Write a generated workload to the activity topic; prints how many events and their
    receive-time range."""
    span = span_minutes * MINUTE_MS
    s = settings()
    plan = ActivityPlan(
        sessions=sessions,
        users=users,
        span_ms=span,
        skew_ms=skew_minutes * MINUTE_MS,
        allowed_ms=round(s.allowed_lateness_s * 1000),
        seed=seed,
        start_ms=now_ms() - span if start_ms is None else start_ms,
    )
    events = generate(plan)
    try:
        producer = _producer()
        sent = producer.send(events)
        producer.flush()
    except (TributaryError, TimeoutError) as exc:
        fail(str(exc))
    received = [e.received_time for e in events]
    _print(
        {
            "topic": s.activity_topic,
            "events": sent,
            "searches": sum(e.type == "search" for e in events),
            "clicks": sum(e.type == "click" for e in events),
            "first_received_ms": min(received, default=None),
            "last_received_ms": max(received, default=None),
        }
    )


SkewOption = Annotated[int, typer.Option(help="How far the device's clock is off (ms).")]
HeldOption = Annotated[
    int, typer.Option(min=0, help="How long the device held the event before sending it (ms).")
]


@activity_app.command("search")
def activity_search(
    session_id: Annotated[str, typer.Argument(help="The front end's session id (the key).")],
    user_id: Annotated[int, typer.Argument(min=1)],
    query: Annotated[str, typer.Argument(help="The text searched.")],
    skew_ms: SkewOption = 0,
    held_ms: HeldOption = 0,
) -> None:
    """Send one search received now; prints the event (its event_id is a click's SEARCH_ID)."""
    try:
        event = _producer().search(session_id, user_id, query, skew_ms=skew_ms, held_ms=held_ms)
    except (TributaryError, TimeoutError) as exc:
        fail(str(exc))
    _print(event.as_dict())


@activity_app.command("click")
def activity_click(
    session_id: Annotated[str, typer.Argument(help="The front end's session id (the key).")],
    user_id: Annotated[int, typer.Argument(min=1)],
    search_id: Annotated[str, typer.Argument(help="The event_id of the search clicked from.")],
    search_time: Annotated[int, typer.Argument(help="That search's event_time (ms).")],
    post_id: Annotated[int, typer.Argument(min=1, help="The post clicked.")],
    skew_ms: SkewOption = 0,
    held_ms: HeldOption = 0,
) -> None:
    """Send one click on a search's result, received now; prints the event."""
    try:
        event = _producer().click(
            session_id, user_id, search_id, search_time, post_id, skew_ms=skew_ms, held_ms=held_ms
        )
    except (TributaryError, TimeoutError) as exc:
        fail(str(exc))
    _print(event.as_dict())
