"""A benchmark stopped by SIGTERM (``timeout``, a CI step, ``kill``) stops the stack it started.

Python's default for SIGTERM ends the process at once: no ``finally`` runs, and the local stack
the benchmark started (PostgreSQL, Redis, the broker, the object store) is left running with no
parent. Made to raise ``SystemExit`` instead, the signal unwinds the benchmark like Ctrl-C does,
through the ``finally`` that stops the stack and removes its folder.
"""

import signal
import sys
from types import FrameType


def _exit(signum: int, _frame: FrameType | None) -> None:
    sys.exit(128 + signum)


def stop_cleanly_on_sigterm() -> None:
    """Call first in a benchmark's ``__main__`` (the main thread)."""
    signal.signal(signal.SIGTERM, _exit)
