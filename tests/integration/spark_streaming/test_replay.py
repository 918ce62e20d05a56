"""Replay: a rebuild from offset zero equals the live view, reads never fail meanwhile, the swap
is atomic, and a failed rebuild leaves the live view alone. A verified rebuild compares the
rebuilt generation with the live one at the live one's offsets: a tampered live view is listed
and the swap refused (``tributary replay``), ``--force`` swaps, ``--check-only`` never does."""

import json
import threading
import time
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from infra.polling import poll_until
from spark_streaming.errors import ReplayError
from spark_streaming.replay import replay
from spark_streaming.runner import ViewRunner
from spark_streaming.view_job import ViewJob, checkpoint_dir
from tests.integration.spark_streaming.changefeed import ChangeFeed, mirror_rows
from tests.integration.spark_streaming.test_mirror_view import assert_mirrors, run_mirror
from tributary.view_store import CommitHooks
from views.catalog import ViewsConfig, configured_views


class Reader(threading.Thread):
    """Reads the live table in a loop, keeping each answer with the phases it began and ended
    in (0: before the replay, 1: while it runs, 2: after it returned), and any error."""

    def __init__(self, dsn: str, table: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.table = dsn, table
        self.phase = 0  # set by the test
        self.answers: list[tuple[int, int, tuple[Any, ...] | None]] = []
        self.errors: list[BaseException] = []
        self.halt = threading.Event()
        self.read_in = [threading.Event() for _ in range(3)]  # a read began and ended in it

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.halt.is_set():
                    began = self.phase
                    try:
                        answer = count_and_sum(conn, self.table)
                    except psycopg.Error as exc:
                        self.errors.append(exc)
                    else:
                        ended = self.phase
                        self.answers.append((began, ended, answer))
                        if began == ended:
                            self.read_in[began].set()
                    time.sleep(0.005)
        except BaseException as exc:  # the connection, or anything else: kept, not lost
            self.errors.append(exc)


def count_and_sum(conn: psycopg.Connection[Any], table: str) -> tuple[Any, ...] | None:
    return conn.execute(f"SELECT count(*), sum(qty) FROM {table}").fetchone()


def full_rows(dsn: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()


def table_names(dsn: str, schema: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
    return {r[0] for r in rows}


def test_replay_rebuilds_an_identical_table_while_reads_keep_working(
    spark: Any, feed: ChangeFeed, views_config: ViewsConfig
) -> None:
    feed.run(2500)
    table = run_mirror(spark, views_config)
    live_before = full_rows(feed.dsn, table)
    [spec] = configured_views(views_config).values()
    old_generation = spec.store.live_generation()

    # Nothing writes to the view meanwhile: every read must answer what it answers now.
    with psycopg.connect(feed.dsn, autocommit=True) as conn:
        answer_before = count_and_sum(conn, table)
    assert answer_before is not None and answer_before[0] == len(live_before)

    reader = Reader(feed.dsn, table)
    reader.start()
    try:
        assert reader.read_in[0].wait(30), reader.errors  # a read before the replay starts
        reader.phase = 1
        result = replay(
            spark, spec, views_config.kafka, views_config.job_options(max_offsets_per_trigger=500)
        )
        reader.phase = 2
        assert reader.read_in[2].wait(30), reader.errors  # and one after it returned
    finally:
        reader.halt.set()
        reader.join(10)
    assert not reader.is_alive()

    assert reader.errors == [] and len(reader.answers) > 20
    assert reader.read_in[1].is_set()  # reads began and ended while the replay ran
    assert [a for a in reader.answers if a[2] != answer_before] == []
    assert result.replaced == old_generation and result.batches >= 5
    assert spec.store.live_generation() == result.generation
    # Same rows, positions and applied-counts as the live view it replaced.
    assert full_rows(feed.dsn, table) == live_before
    assert table_names(feed.dsn, views_config.views_schema) == {
        "_tributary_live",
        "_tributary_ledger",
        table.split(".")[1],
        table.split(".")[1] + "__deleted",
    }
    old_checkpoint = checkpoint_dir(views_config.checkpoint_root, spec.name, old_generation)
    assert old_checkpoint.exists()  # a job may still run on it: pruned when the view restarts

    # A job still running the old generation stops at its next batch instead of writing.
    feed.run(200)
    stale = ViewJob(
        spark, spec, views_config.kafka, views_config.job_options(), generation=old_generation
    )
    query = stale.start(available_now=True)
    with pytest.raises(Exception, match="was rebuilt"):
        query.awaitTermination(120)
    stale.close()
    # Restarted on the new generation, the view continues from the rebuild's checkpoint.
    run_mirror(spark, views_config)
    assert_mirrors(feed, table)
    assert not old_checkpoint.exists()


def test_a_failed_rebuild_leaves_the_live_view_alone(
    spark: Any, feed: ChangeFeed, views_config: ViewsConfig
) -> None:
    feed.run(1200)
    table = run_mirror(spark, views_config)
    live_before = full_rows(feed.dsn, table)
    [spec] = configured_views(views_config).values()
    generation = spec.store.live_generation()

    def crash(batch_id: int) -> None:
        if batch_id == 1:
            raise RuntimeError("disk full (injected)")

    with pytest.raises(ReplayError, match="injected"):
        replay(
            spark,
            spec,
            views_config.kafka,
            views_config.job_options(max_offsets_per_trigger=500),
            hooks=CommitHooks(before_commit=crash),
        )
    assert spec.store.live_generation() == generation
    assert full_rows(feed.dsn, table) == live_before
    assert not any("__g" in name for name in table_names(feed.dsn, views_config.views_schema))
    feed.run(100)
    run_mirror(spark, views_config)
    assert_mirrors(feed, table)


def test_running_views_follow_a_replay_while_changes_keep_coming(
    spark: Any, feed: ChangeFeed, views_config: ViewsConfig
) -> None:
    [spec] = configured_views(views_config).values()
    table = f"{views_config.views_schema}.{feed.schema}_{feed.table}"
    logs: list[str] = []
    runner = ViewRunner(
        spark,
        [spec],
        views_config.kafka,
        views_config.job_options(trigger_interval_s=0.5),
        log=logs.append,
        min_backoff_s=0.5,
    )
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, args=(stop,), daemon=True)
    feed.run(1000)
    thread.start()
    try:
        poll_until(lambda: mirror_matches(feed, table), 120, "the mirror to equal the source")
        generation = spec.store.live_generation()
        replay(spark, spec, views_config.kafka, views_config.job_options())
        feed.run(300)  # the live job meets the swap at its next batch, restarts, catches up
        poll_until(lambda: mirror_matches(feed, table), 120, "the mirror to equal the source")
        assert spec.store.live_generation() != generation
        assert any("was rebuilt" in line for line in logs), logs
    finally:
        stop.set()
        thread.join(60)
    assert_mirrors(feed, table)


def mirror_matches(feed: ChangeFeed, table: str) -> bool:
    try:
        return mirror_rows(feed.dsn, table) == feed.rows()
    except psycopg.errors.UndefinedTable:  # until the view's first batch creates it
        return False


def test_a_replay_from_an_empty_topic_refuses_to_swap(
    spark: Any, feed: ChangeFeed, views_config: ViewsConfig
) -> None:
    [spec] = configured_views(views_config).values()
    generation = spec.store.live_generation()
    with pytest.raises(ReplayError, match="holds no records"):
        replay(spark, spec, views_config.kafka, views_config.job_options())
    assert spec.store.live_generation() == generation


def key(row_id: int) -> str:
    """A mirror row's key as the store lists it (its primary key as JSON)."""
    return json.dumps({"id": row_id}, separators=(",", ":"))


class SharedSpark:
    """The session's SparkSession for the CLI, which stops the one it was given."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def __getattr__(self, name: str) -> Any:
        return getattr(self.spark, name)

    def stop(self) -> None:
        """The test session's Spark stays up."""


def test_a_tampered_live_view_is_listed_and_its_swap_refused_unless_forced(
    spark: Any, feed: ChangeFeed, views_config: ViewsConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    feed.run(800)
    table = run_mirror(spark, views_config)
    [spec] = configured_views(views_config).values()
    # Changes the live view has not applied yet: the rebuild stops at the live view's offsets,
    # so they are no difference.
    feed.run(200)
    first = spec.store.live_generation()
    untouched = replay(spark, spec, views_config.kafka, views_config.job_options())
    assert untouched.compared and untouched.identical and untouched.swapped
    [comparison] = untouched.comparisons
    assert comparison.same_positions and comparison.live_entries == len(full_rows(feed.dsn, table))
    assert comparison.live_commit.offsets == spec.store.committed(untouched.generation).offsets
    assert untouched.replaced == first
    run_mirror(spark, views_config)  # the new generation goes on from there
    assert_mirrors(feed, table)

    # Behind the view's back: one row changed, one deleted.
    ids = sorted(feed.rows())
    changed, deleted = ids[0], ids[1]
    with psycopg.connect(feed.dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {table} SET qty = qty + 100000 WHERE id = %s", (changed,))
        conn.execute(f"DELETE FROM {table} WHERE id = %s", (deleted,))
    tampered = full_rows(feed.dsn, table)
    live = spec.store.live_generation()

    import infra.cli_views
    import infra.views
    from infra.cli import app

    monkeypatch.setattr(infra.cli_views, "settings", lambda light=False: None)
    monkeypatch.setattr(infra.views, "views_config", lambda _s: views_config)
    monkeypatch.setattr(infra.cli_views, "_spark", lambda _s, _c: SharedSpark(spark))
    cli = CliRunner()

    def shadows() -> list[str]:
        return [n for n in table_names(feed.dsn, views_config.views_schema) if "__g" in n]

    # --check-only: compared, listed, dropped; the live view is left as it was.
    checked = cli.invoke(app, ["replay", spec.name, "--check-only", "--json"])
    assert checked.exit_code == 3, checked.output
    report = json.loads(checked.stdout.strip().splitlines()[-1])
    assert (report["swapped"], report["compared"], report["identical"]) == (False, True, False)
    [store] = report["comparisons"]
    listed = {d["key"]: d for d in store["differences"]}
    assert report["different"] == 2 and set(listed) == {
        key(changed),
        key(deleted),
    }
    one = listed[key(changed)]
    assert one["kind"] == "different"
    assert one["live"]["fields"]["qty"] == one["shadow"]["fields"]["qty"] + 100000
    gone = listed[key(deleted)]
    assert gone["kind"] == "missing in live" and gone["shadow"]["fields"]["id"] == deleted
    assert spec.store.live_generation() == live and full_rows(feed.dsn, table) == tampered
    assert shadows() == []

    # A plain replay lists the differences and refuses the swap.
    refused = cli.invoke(app, ["replay", spec.name])
    assert refused.exit_code == 3, refused.output
    assert "2 differ" in refused.output and "missing in live" in refused.output
    assert f"{key(changed)}: different (the fields that differ)" in refused.output
    with psycopg.connect(feed.dsn) as conn:
        [live_qty] = conn.execute(f"SELECT qty FROM {table} WHERE id = %s", (changed,)).fetchone()
    assert f'live:    {{"qty":{live_qty}}} @' in refused.output
    assert f'rebuilt: {{"qty":{live_qty - 100000}}} @' in refused.output
    assert "the swap is refused" in refused.output and "--force" in refused.output
    assert spec.store.live_generation() == live and full_rows(feed.dsn, table) == tampered
    assert shadows() == []

    # --force swaps the rebuilt generation in: the tampering is gone.
    forced = cli.invoke(app, ["replay", spec.name, "--force"])
    assert forced.exit_code == 0, forced.output
    assert "2 entries differ: forced" in forced.output
    assert spec.store.live_generation() != live
    assert_mirrors(feed, table)
