"""Shared test configuration: keep the developer's own settings out of the tests."""

import os

import pytest

from tests.jvm import CDC_JAVA_OPTIONS, SPARK_JAVA_OPTIONS

for _key in [
    k for k in os.environ if k.startswith("TRIBUTARY_") and not k.startswith("TRIBUTARY_TEST_")
]:
    del os.environ[_key]

os.environ["TRIBUTARY_SPARK_JAVA_OPTIONS"] = SPARK_JAVA_OPTIONS  # every `tributary` child's
os.environ["TRIBUTARY_CDC_JAVA_OPTIONS"] = CDC_JAVA_OPTIONS


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        from tests.scheduling import SparkApart

        config.pluginmanager.register(SparkApart(), "tributary-spark-apart")
