"""The ``tributary`` command line: the app plus every command module that registers on it."""

from infra import cli_cdc, cli_run, cli_stack  # noqa: F401  (they register their commands)
from infra.cli_app import app

__all__ = ["app", "main"]


def main() -> None:
    app()


if __name__ == "__main__":
    main()
