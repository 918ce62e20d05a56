"""Fixtures of the analytics tests: the session's SparkSession."""

from tests.integration.spark_streaming.conftest import spark  # noqa: F401
