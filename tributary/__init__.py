"""Tributary: Kafka-centric change-data-capture and event sourcing.

The root of the exception hierarchy lives here so every package can share it
without importing another layer.
"""

from tributary.errors import TributaryError

__all__ = ["TributaryError", "__version__"]
__version__ = "0.1.0"
