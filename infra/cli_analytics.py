"""CLI: the analytics alerts (``tributary alerts [--follow]``).

``alerts`` prints the analytics alerts (newest first) as JSON lines; ``--follow`` then prints
each new or revised alert as it is committed, oldest first, until interrupted. (The raw
activity stream's commands, ``tributary activity …``, are the demo domain's CLI plug-in:
``examples.social.activity_cli``.)
"""

import json
import sys
import time
from typing import Annotated, Any

import typer

from infra.cli_app import app, fail, settings
from tributary.errors import TributaryError


def _print(value: Any) -> None:
    sys.stdout.write(json.dumps(value, separators=(",", ":")) + "\n")
    sys.stdout.flush()


@app.command("alerts")
def alerts_command(
    kind: Annotated[str, typer.Option(help="burst or churn (default: both).")] = "",
    user_id: Annotated[int, typer.Option(min=0, help="One user's alerts (0: everyone's).")] = 0,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="How many recent alerts.")] = 20,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Then print new and revised alerts as they come.")
    ] = False,
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between polls.")] = 1.0,
) -> None:
    """The analytics alerts (burst: 5+ posts in 60 s; churn: a follow undone within 10 min) as
    JSON lines, newest first; with --follow, then every new or revised alert, as committed.
    Needs the analytics jobs (TRIBUTARY_ANALYTICS)."""
    from infra import view_queries
    from infra.views import views_config
    from views.catalog import configured_views

    s = settings()
    try:
        views = list(configured_views(views_config(s)).values())
        entry = view_queries.find_query(view_queries.declared_queries(views), "alerts")
    except TributaryError as exc:
        fail(f"{exc} (set TRIBUTARY_ANALYTICS=examples.social.analytics:social_analytics)")

    def recent(count: int) -> list[dict[str, Any]]:
        try:
            rows: list[dict[str, Any]] = entry.query.run(kind=kind, user_id=user_id, limit=count)
        except (TributaryError, ValueError) as exc:
            fail(str(exc))
        return rows

    seen: dict[str, Any] = {}
    for row in recent(limit):
        seen[row["alert_id"]] = row["revision"]
        _print(row)
    if not follow:
        return
    try:
        while True:
            time.sleep(interval)
            for row in reversed(recent(1000)):
                if seen.get(row["alert_id"]) != row["revision"]:
                    seen[row["alert_id"]] = row["revision"]
                    _print(row)
    except KeyboardInterrupt:
        return
