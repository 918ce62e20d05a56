"""CLI: `run` the long-running parts."""

from typing import Annotated

import typer

from infra.cli_app import app, fail, settings
from infra.cli_cdc import run_component

COMPONENTS = ("cdc",)


@app.command()
def run(
    components: Annotated[
        list[str] | None, typer.Argument(help=f"What to run: {', '.join(COMPONENTS)}.")
    ] = None,
) -> None:
    """Run long-running parts until SIGTERM/Ctrl-C (one component runs in the foreground)."""
    chosen = components or list(COMPONENTS)
    if len(chosen) != 1:
        fail("run one component at a time for now: " + ", ".join(COMPONENTS))
    run_component(chosen[0], settings())
