"""Fixtures of the end-to-end pipeline tests: the real CDC connector and real view processes."""

from tests.integration.cdc.conftest import connector_factory  # noqa: F401
