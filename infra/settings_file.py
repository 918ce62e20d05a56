"""Where the settings' TOML file is (``TRIBUTARY_CONFIG_FILE``, default ``./tributary.toml``):
shared by :mod:`infra.settings` and what reads one setting before the settings load."""

import os
from pathlib import Path

CONFIG_FILE_ENV = "TRIBUTARY_CONFIG_FILE"
DEFAULT_CONFIG_FILE = "tributary.toml"


def config_file() -> Path:
    """The settings file named by the environment (it may not exist)."""
    return Path(os.environ.get(CONFIG_FILE_ENV, DEFAULT_CONFIG_FILE))
