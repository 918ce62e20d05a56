"""Processes by id, for code that cannot import the local stack's helpers (``infra.stack``)."""

import os


def pid_exists(pid: int) -> bool:
    """Whether a process with this id exists (another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
