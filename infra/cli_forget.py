"""CLI: `tributary forget SUBJECT_TYPE ID [--json]`."""

import json
import sys
from typing import Annotated

import typer

from infra.cli_app import JsonFlag, app, console, fail, settings
from tributary.errors import TributaryError


@app.command("forget")
def forget_command(
    subject_type: Annotated[str, typer.Argument(help="The subject's type, e.g. user.")],
    subject_id: Annotated[str, typer.Argument(help="The subject's id, e.g. 42.")],
    as_json: JsonFlag = False,
) -> None:
    """Forget a data subject: destroy its key (its personal fields in the event store, on
    events.* and in every replay become unreadable) and append SubjectForgotten, which every
    view purges the subject on within its next micro-batch. Refuses (exit 2, printing the
    DELETEs) while the application's captured tables still hold the subject; exit 1 for an
    unknown subject; a subject already forgotten is a no-op (exit 0)."""
    from infra.forgetting import EXIT_CODES, forget_subject

    try:
        result = forget_subject(settings(), subject_type, subject_id)
    except (TributaryError, ValueError) as exc:  # a malformed subject, the store not set up
        fail(str(exc))
    if as_json:
        sys.stdout.write(json.dumps(result.as_json()) + "\n")
    else:
        console.print(result.message, markup=False, highlight=False)
    raise SystemExit(EXIT_CODES[result.status])
