"""The ``tributary`` command line: the app plus every command module that registers on it."""

from infra import cli_stack  # noqa: F401  (registers its commands)
from infra.cli_app import app

__all__ = ["app", "main"]


def main() -> None:
    app()


if __name__ == "__main__":
    main()
