"""The store holds the truth: a view resumes from the offsets its store committed, whatever
happened to Spark's checkpoint - deleted after a kill -9, restored from an older copy, or ahead
of a store that was itself restored from an older backup."""

import shutil
from pathlib import Path
from typing import Any

import psycopg

from spark_streaming.view_job import checkpoint_dir
from tests.integration.spark_streaming.changefeed import ChangeFeed, applied_counts, mirror_rows
from tests.integration.spark_streaming.test_crash_recovery import (
    driver,
    kill_group,
    run_to_end,
    view_table,
    wait_marker,
)
from views.catalog import ViewsConfig, configured_views


def assert_mirrors(feed: ChangeFeed, table: str) -> None:
    source = feed.rows()
    assert mirror_rows(feed.dsn, table) == source
    assert applied_counts(feed.dsn, table) == {k: v[3] for k, v in source.items()}


def checkpoint_of(config: ViewsConfig) -> Path:
    [view] = configured_views(config).values()
    return checkpoint_dir(config.checkpoint_root, view.name, view.store.live_generation())


def store_offsets(config: ViewsConfig) -> int:
    [view] = configured_views(config).values()
    commit = view.store.committed(view.store.live_generation())
    return sum(o for parts in commit.offsets.values() for o in parts.values())


def test_checkpoint_deleted_after_a_kill_9_resumes_from_the_store(
    spark: Any, feed: ChangeFeed, views_config: ViewsConfig, tmp_path: Path
) -> None:
    feed.run(1500)
    marker = tmp_path / "paused"
    proc = driver(views_config, feed, pause_at="after_commit", pause_batch=2, marker=str(marker))
    wait_marker(proc, marker)
    kill_group(proc)
    shutil.rmtree(checkpoint_of(views_config))  # the checkpoint folder is gone
    reached = store_offsets(views_config)
    assert reached > 0
    feed.run(500)

    batches = run_to_end(spark, views_config)
    # A new checkpoint, starting where the store stood: nothing read twice, nothing skipped.
    assert batches[0]["batch_id"] == 0 and all(b["applied"] for b in batches)
    assert sum(b["records"] for b in batches) == len(feed.sent) - reached
    assert_mirrors(feed, view_table(views_config, feed))


def test_an_older_checkpoint_copy_skips_what_the_store_has(
    spark: Any, feed: ChangeFeed, views_config: ViewsConfig, tmp_path: Path
) -> None:
    feed.run(800)
    run_to_end(spark, views_config)
    checkpoint = checkpoint_of(views_config)
    old = tmp_path / "old-checkpoint"
    shutil.copytree(checkpoint, old)
    feed.run(800)
    run_to_end(spark, views_config)
    shutil.rmtree(checkpoint)
    shutil.copytree(old, checkpoint)  # restored from the older copy
    feed.run(200)

    batches = run_to_end(spark, views_config)
    # Spark replays from the old checkpoint; batches the store has are skipped, not re-applied.
    assert any(not b["applied"] for b in batches) and batches[-1]["applied"]
    assert_mirrors(feed, view_table(views_config, feed))


def test_a_checkpoint_ahead_of_a_restored_store_is_reset(
    spark: Any, feed: ChangeFeed, views_config: ViewsConfig
) -> None:
    schema = views_config.views_schema
    table = view_table(views_config, feed)
    feed.run(700)
    run_to_end(spark, views_config)
    with psycopg.connect(feed.dsn, autocommit=True) as conn:  # a backup of the store
        conn.execute(f"CREATE TABLE {schema}.backup_rows AS SELECT * FROM {table}")
        conn.execute(f"CREATE TABLE {schema}.backup_gone AS SELECT * FROM {table}__deleted")
        conn.execute(
            f"CREATE TABLE {schema}.backup_ledger AS SELECT * FROM {schema}._tributary_ledger"
        )
    feed.run(700)
    run_to_end(spark, views_config)
    with psycopg.connect(feed.dsn, autocommit=True) as conn:  # restore the older backup
        conn.execute(f"TRUNCATE {table}, {table}__deleted, {schema}._tributary_ledger")
        conn.execute(f"INSERT INTO {table} SELECT * FROM {schema}.backup_rows")
        conn.execute(f"INSERT INTO {table}__deleted SELECT * FROM {schema}.backup_gone")
        conn.execute(f"INSERT INTO {schema}._tributary_ledger SELECT * FROM {schema}.backup_ledger")
    feed.run(100)

    batches = run_to_end(spark, views_config)
    # The checkpoint would have skipped the 700 changes the store lost: it was moved aside and
    # the query restarted from the store's offsets.
    checkpoint = checkpoint_of(views_config)
    assert any(".reset-" in p.name for p in checkpoint.parent.iterdir())
    assert batches[0]["batch_id"] == 0
    assert_mirrors(feed, table)
