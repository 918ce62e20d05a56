"""Shared test configuration: keep the developer's own settings out of the tests."""

import os

import pytest

for _key in [
    k for k in os.environ if k.startswith("TRIBUTARY_") and not k.startswith("TRIBUTARY_TEST_")
]:
    del os.environ[_key]


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        from tests.scheduling import SparkApart

        config.pluginmanager.register(SparkApart(), "tributary-spark-apart")
