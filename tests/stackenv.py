"""Moved to :mod:`infra.stack.isolated` (kept for bench/cdc.py and bench/append.py until
their import lines change)."""

from infra.stack.isolated import isolated_settings, settings_env

__all__ = ["isolated_settings", "settings_env"]
