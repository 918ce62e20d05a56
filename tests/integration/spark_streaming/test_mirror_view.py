"""The mirror view against a real broker, Spark and PostgreSQL."""

from typing import Any

from spark_streaming.view_job import BatchReport, ViewJob
from spark_streaming.views import ViewsConfig, configured_views
from tests.integration.spark_streaming.changefeed import ChangeFeed, applied_counts, mirror_rows


def run_mirror(spark: Any, config: ViewsConfig, reports: list[BatchReport] | None = None) -> str:
    [spec] = configured_views(config).values()
    job = ViewJob(
        spark,
        spec,
        config.kafka,
        config.job_options(),
        on_batch=None if reports is None else reports.append,
    )
    query = job.start(available_now=True)
    query.awaitTermination(300)
    assert query.exception() is None
    job.sink_close()
    return f"{config.views_schema}.{spec.target.table.name}"  # type: ignore[attr-defined]


def test_mirror_equals_source_after_thousands_of_changes(
    spark: Any, feed: ChangeFeed, views_config: ViewsConfig
) -> None:
    feed.run(3000)
    reports: list[BatchReport] = []
    table = run_mirror(spark, views_config, reports)
    assert len(reports) >= 3  # maxOffsetsPerTrigger=1000 split the topic into batches
    source = feed.rows()
    assert len(source) > 300
    assert mirror_rows(feed.dsn, table) == source
    assert applied_counts(feed.dsn, table) == {k: v[3] for k, v in source.items()}
