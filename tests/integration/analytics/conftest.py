"""Fixtures of the analytics tests: the session's SparkSession."""

from tests.integration.spark_streaming.conftest import session_spark, spark  # noqa: F401
