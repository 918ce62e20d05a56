"""Fixtures of the social views' tests: the session's SparkSession, a world of one's own."""

from tests.integration.social.world import world  # noqa: F401
from tests.integration.spark_streaming.conftest import session_spark, spark  # noqa: F401
