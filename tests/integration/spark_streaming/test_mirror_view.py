"""The mirror view against a real broker, Spark and PostgreSQL."""

import json
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from infra.telemetry.batches import ViewBatchMetrics
from infra.telemetry.endpoint import part_registry
from spark_streaming.view_job import BatchReport, ViewJob
from tests.integration.spark_streaming.changefeed import ChangeFeed, applied_counts, mirror_rows
from views.catalog import ViewsConfig, configured_views
from views.dead_letters import REASON_HEADER, dlq_topic
from views.lag import view_group


def run_mirror(
    spark: Any,
    config: ViewsConfig,
    reports: list[BatchReport] | None = None,
) -> str:
    """Run the configured mirror until it has read everything; returns its table."""
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
    job.close()
    [table] = config.mirror_tables
    return f"{config.views_schema}.{table.replace('.', '_')}"


def group_offsets(config: ViewsConfig, group: str, topic: str) -> dict[int, int]:
    """A consumer group's committed offsets on a topic, as ``kafka-consumer-groups`` shows
    them (the admin API's ListConsumerGroupOffsets)."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(config.kafka.client_properties())
    request = [ConsumerGroupTopicPartitions(group)]
    [future] = admin.list_consumer_group_offsets(request).values()
    result = future.result(timeout=30)
    return {tp.partition: tp.offset for tp in result.topic_partitions if tp.topic == topic}


def assert_mirrors(feed: ChangeFeed, table: str) -> None:
    source = feed.rows()
    assert mirror_rows(feed.dsn, table) == source
    assert applied_counts(feed.dsn, table) == {k: v[3] for k, v in source.items()}


def test_mirror_equals_source_after_thousands_of_changes(
    spark: Any, feed: ChangeFeed, views_config: ViewsConfig
) -> None:
    feed.run(3000)
    reports: list[BatchReport] = []
    table = run_mirror(spark, views_config, reports)
    assert len(reports) >= 3  # maxOffsetsPerTrigger=1000 split the topic into batches
    assert len(feed.rows()) > 300
    assert_mirrors(feed, table)
    # Lag tools see the view as the consumer group tributary.view.<name>, at the offsets its
    # store applied (the ledger), never ahead of them.
    [spec] = configured_views(views_config).values()
    ledger = spec.store.committed(spec.store.live_generation()).offsets
    assert group_offsets(views_config, view_group(spec.name), feed.topic) == {
        int(p): o for p, o in ledger[feed.topic].items()
    }
    # More changes later: the same query (checkpoint) continues from where it stopped.
    feed.run(500)
    run_mirror(spark, views_config)
    assert_mirrors(feed, table)


def test_a_warm_up_folds_the_head_of_the_topic_and_applies_nothing(
    spark: Any, feed: ChangeFeed, views_config: ViewsConfig
) -> None:
    feed.run(400)
    [spec] = configured_views(views_config).values()
    job = ViewJob(spark, spec, views_config.kafka, views_config.job_options())
    try:
        rows = job.warm_up(records=50)
    finally:
        job.close()
    assert 0 < rows <= 50  # the fold ran, over the first 50 records only
    committed = spec.store.committed(spec.store.live_generation())
    assert committed.batches == 0 and not committed.offsets  # the store got nothing
    table = run_mirror(spark, views_config)  # the real query starts from offset zero
    assert_mirrors(feed, table)


def test_resending_old_cdc_records_changes_nothing(
    spark: Any, feed: ChangeFeed, views_config: ViewsConfig
) -> None:
    feed.run(800)
    table = run_mirror(spark, views_config)
    before = mirror_rows(feed.dsn, table), applied_counts(feed.dsn, table)
    feed.resend(feed.sent[:400])  # upstream at-least-once: an old stretch arrives again
    feed.resend(feed.sent[-50:])
    reports: list[BatchReport] = []
    run_mirror(spark, views_config, reports)
    assert sum(r.records for r in reports) == 450 and all(r.applied for r in reports)
    assert (mirror_rows(feed.dsn, table), applied_counts(feed.dsn, table)) == before
    assert_mirrors(feed, table)


def test_poison_records_go_to_the_dlq_and_the_mirror_converges(
    spark: Any, feed: ChangeFeed, views_config: ViewsConfig
) -> None:
    feed.run(300)
    feed.produce_raw(b'{"id": 999999}', b"not json at all")
    bad_op = {"op": "x", "before": None, "after": {"id": 5}, "source": {"lsn": 1}}
    feed.produce_raw(b'{"id": 5}', json.dumps(bad_op).encode())
    no_after = {"op": "u", "before": None, "after": None, "source": {"lsn": 10**12}}
    feed.produce_raw(b'{"id": 6}', json.dumps(no_after).encode())
    feed.run(300)
    reports: list[BatchReport] = []
    table = run_mirror(spark, views_config, reports)
    assert sum(r.rejected for r in reports) == 3
    assert_mirrors(feed, table)

    consumer = Consumer(views_config.kafka.client_properties(**{"group.id": "dlq-check"}))
    consumer.assign([TopicPartition(dlq_topic(f"mirror.{feed.qualified}"), 0, 0)])
    dead = []
    while len(dead) < 3:
        dead += [m for m in consumer.consume(3 - len(dead), timeout=10) if m.error() is None]
    consumer.close()
    reasons = {m.key(): dict(m.headers() or [])[REASON_HEADER].decode() for m in dead}
    assert "value is not JSON" in reasons[b'{"id": 999999}']
    assert "no valid op" in reasons[b'{"id": 5}']
    assert "without an 'after' row" in reasons[b'{"id": 6}']
    values = {m.key(): m.value() for m in dead}
    assert values[b'{"id": 999999}'] == b"not json at all"  # the original record, unchanged


def test_a_row_the_mirror_table_refuses_goes_to_the_dlq_and_the_view_moves_on(
    spark: Any, feed: ChangeFeed, views_config: ViewsConfig
) -> None:
    feed.run(200)
    bad = {
        "op": "c",
        "before": None,
        "after": {"id": 777777, "name": "x", "qty": "not a number", "active": True, "version": 1},
        "source": {"lsn": 10**12},
    }
    feed.produce_raw(b'{"id": 777777}', json.dumps(bad).encode())
    feed.run(200)
    reports: list[BatchReport] = []
    table = run_mirror(spark, views_config, reports)
    assert sum(r.rejected for r in reports) == 1
    assert_mirrors(feed, table)

    consumer = Consumer(views_config.kafka.client_properties(**{"group.id": "dlq-check"}))
    consumer.assign([TopicPartition(dlq_topic(f"mirror.{feed.qualified}"), 0, 0)])
    [dead] = [m for m in consumer.consume(1, timeout=10) if m.error() is None]
    consumer.close()
    headers = {k: v.decode() for k, v in dead.headers() or [] if v is not None}
    assert headers["tributary.error.stage"] == "write"
    assert headers["tributary.view"] == f"mirror.{feed.qualified}"
    assert "invalid input syntax for type integer" in headers[REASON_HEADER]
    assert headers["tributary.source.topic"] == feed.topic
    assert json.loads(dead.value())["qty"] == "not a number"


def test_each_trigger_is_timed_by_phase_for_the_views_metrics(
    spark: Any, feed: ChangeFeed, views_config: ViewsConfig
) -> None:
    feed.run(300)  # about 350 records: several batches of 100
    registry = part_registry()
    metrics = ViewBatchMetrics(registry)
    [spec] = configured_views(views_config).values()
    reports: list[BatchReport] = []
    job = ViewJob(
        spark,
        spec,
        views_config.kafka,
        views_config.job_options(max_offsets_per_trigger=100),
        on_batch=reports.append,
        on_phases=metrics.observe_phases,
    )
    try:
        assert job.warm_up(records=50) > 0  # a warm-up's query is not the view's
        query = job.start(available_now=True)
        assert query.awaitTermination(300) and query.exception() is None
    finally:
        job.close()
    assert len(reports) >= 3
    # Each trigger's phases are read when the next batch starts: all but the last one's.
    heard = reports[:-1]
    counts = phase_counts(registry, spec.name)
    assert counts["triggerExecution"] == counts["addBatch"] == len(heard)
    assert {"latestOffset", "queryPlanning", "walCommit", "commitOffsets"} <= set(counts)
    sums = phase_sums(registry, spec.name)
    # The foreachBatch body (fold and apply) is part of addBatch, which is part of the trigger.
    assert sum(r.fold_s + r.write_s for r in heard) <= sums["addBatch"] + 0.01
    assert sums["addBatch"] <= sums["triggerExecution"]
    assert {labels["view"] for labels in phase_labels(registry)} == {spec.name}


def phase_labels(registry: Any) -> list[dict[str, str]]:
    return [
        s.labels
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        if f.name == "tributary_view_trigger_phase_seconds"
        for s in f.samples
        if s.name.endswith("_count")
    ]


def phase_values(registry: Any, view: str, suffix: str) -> dict[str, float]:
    return {
        s.labels["phase"]: s.value
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        if f.name == "tributary_view_trigger_phase_seconds"
        for s in f.samples
        if s.name.endswith(suffix) and s.labels.get("view") == view
    }


def phase_counts(registry: Any, view: str) -> dict[str, float]:
    return phase_values(registry, view, "_count")


def phase_sums(registry: Any, view: str) -> dict[str, float]:
    return phase_values(registry, view, "_sum")
