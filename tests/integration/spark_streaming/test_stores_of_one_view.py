"""A view with two stores (as an analytics job has: PostgreSQL and a topic): the other store
applies each batch while the primary does, and the primary waits for it before its commit. When
the other store refuses every write (its Redis out of memory: reads still work, so the job
starts), no batch reaches the primary either; once it takes writes again, the restarted job
applies every batch to both stores, each once."""

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from pyspark.errors import StreamingQueryException

from connectors.stores.redis import RedisStore
from spark_streaming.view_job import BatchReport, ViewJob
from tests.integration.spark_streaming.changefeed import ChangeFeed, applied_counts, mirror_rows
from tributary.view_store import Collection
from views.catalog import ViewsConfig, configured_views

MAX_OFFSETS = 150  # several batches
ROWS = "rows"  # the mirror's collection


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[redis.Redis]:
    """A redis-server of the test's own (its memory limit is the test's to change)."""
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not installed (make setup installs it)"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis.from_url(f"redis://127.0.0.1:{port}/0")
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            assert proc.poll() is None and time.monotonic() < deadline, "redis-server failed"
            time.sleep(0.1)
    yield client
    client.close()
    proc.terminate()
    proc.wait(20)


def run(job: ViewJob) -> Any:
    """Run the job to the end of its topics; the query's error (None: it read everything)."""
    try:
        query = job.start(available_now=True)
        try:
            query.awaitTermination(300)
        except StreamingQueryException as exc:
            return exc
        return query.exception()
    finally:
        job.close()


def test_a_store_that_refuses_writes_holds_the_primary_back_and_both_apply_on_the_retry(
    spark: Any, feed: ChangeFeed, views_config: ViewsConfig, own_redis: redis.Redis
) -> None:
    feed.run(600)
    [mirror] = configured_views(views_config).values()
    url = "redis://{host}:{port}/0".format(**own_redis.connection_pool.connection_kwargs)
    other = RedisStore(url, mirror.name, [Collection(ROWS)])
    view = replace(mirror, also=(other,))
    table = f"{views_config.views_schema}.{feed.schema}_{feed.table}"
    options = views_config.job_options(max_offsets_per_trigger=MAX_OFFSETS)
    reports: list[BatchReport] = []

    job = ViewJob(spark, view, views_config.kafka, options, on_batch=reports.append)
    own_redis.config_set("maxmemory-policy", "noeviction")
    own_redis.config_set("maxmemory", 1)  # every write refused from now on, reads go on
    error = run(job)
    assert error is not None and "Redis refused batch 0" in str(error), error
    assert "maxmemory" in str(error), error
    assert reports == []
    generation = mirror.store.live_generation()
    assert mirror.store.committed(generation).batches == 0  # the primary waited, rolled back
    with psycopg.connect(feed.dsn) as conn:  # its table too: it was made in the rolled-back unit
        assert conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() == (None,)

    own_redis.config_set("maxmemory", 0)
    job = ViewJob(spark, view, views_config.kafka, options, on_batch=reports.append)
    assert run(job) is None
    assert len(reports) > 2 and all(r.applied for r in reports)
    source = feed.rows()
    assert mirror_rows(feed.dsn, table) == source
    assert applied_counts(feed.dsn, table) == {k: v[3] for k, v in source.items()}
    held = {int(e.fields["id"]): int(e.fields["version"]) for e in other.scan(ROWS)}
    assert held == {k: v[3] for k, v in source.items()}
    committed = other.committed(other.live_generation())
    assert committed.offsets == mirror.store.committed(generation).offsets
    assert committed.batches == mirror.store.committed(generation).batches == len(reports)
    other.close()
