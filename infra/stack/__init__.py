"""The local stack: real PostgreSQL, SeaweedFS + Tansu broker, and Redis under a state folder.

Loaded on first use (PEP 562): ``infra.stack.process`` (spawning and stopping processes) is
used by commands that do not need the stack's services or the settings.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.stack.stack import ComponentStatus, LocalStack

__all__ = ["ComponentStatus", "LocalStack"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module("infra.stack.stack"), name)
    globals()[name] = value
    return value
