"""The operators' window against a running stack: a mirror view running on the session's
Spark (its batches counted by the views process's metrics module, served on its own port), a
real ``tributary serve`` process, and Debian's headless Chromium.

- ``/metrics`` during a workload: the lag of a stopped view (records and seconds) grows, and
  falls back to 0 once it runs again;
- ``/ui`` in the browser: live (numbers change without a reload while records arrive), and
  what it shows equals ``tributary views --json``; the view's consumer group
  ``tributary.view.<name>`` (what ``kafka-consumer-groups`` reads) holds the same offsets; a
  screenshot is kept (``TRIBUTARY_TEST_ARTIFACTS``: a folder it is copied to).
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infra.stack.isolated import free_port_block, settings_env
from infra.telemetry.batches import ViewBatchMetrics
from infra.telemetry.endpoint import MetricsEndpoint, part_registry, serve_metrics
from spark_streaming.view_job import ViewJob
from tests.integration.cli_process import ROOT
from tests.integration.conftest import Endpoints
from tests.integration.operations.browser import Browser
from tests.integration.operations.conftest import cli_env, cli_json
from tests.integration.spark_streaming.changefeed import ChangeFeed
from views.catalog import ViewsConfig, configured_views
from views.lag import view_group

SHOWN = """(() => {
  const out = {};
  for (const tr of document.querySelectorAll('#views tr[data-view]')) {
    const fields = {};
    for (const td of tr.querySelectorAll('td[data-field]')) {
      fields[td.dataset.field] = td.textContent;
    }
    out[tr.dataset.view] = fields;
  }
  return out;
})()"""

#: The stack table: each component's state.
STACK_SHOWN = """Object.fromEntries(Array.from(
  document.querySelectorAll('#stack tr[data-component]'),
  (tr) => [tr.dataset.component, tr.querySelectorAll('td')[1].textContent]))"""


@dataclass
class Window:
    """A view running in this process, its batch metrics endpoint, and ``tributary serve``."""

    spark: Any
    config: ViewsConfig
    feed: ChangeFeed
    env: dict[str, str]
    base: str
    batches: ViewBatchMetrics
    job: ViewJob | None = None
    query: Any = None

    @property
    def view(self) -> str:
        return f"mirror.{self.feed.qualified}"

    def start_view(self) -> None:
        [spec] = configured_views(self.config).values()
        self.job = ViewJob(
            self.spark,
            spec,
            self.config.kafka,
            self.config.job_options(),
            on_batch=self.batches.observe,
        )
        self.query = self.job.start()

    def committed_batches(self) -> int:
        """How many batches the view's store has committed (its batch ids may start again at 0
        when a stopped query's last batch is not in Spark's checkpoint; this count never does)."""
        [spec] = configured_views(self.config).values()
        return spec.store.committed(spec.store.live_generation()).batches

    def stop_view(self) -> None:
        if self.query is not None:
            self.query.stop()
            self.query = None
        if self.job is not None:
            self.job.close()
            self.job = None

    def scrape(self) -> dict[str, float]:
        """The view's samples on serve's ``/metrics``."""
        text = httpx.get(f"{self.base}/metrics", timeout=60).text
        return {
            s.name: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.labels.get("view") == self.view
        }

    def wait_metrics(self, check: Any, timeout: float = 120) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        samples: dict[str, float] = {}
        while time.monotonic() < deadline:
            assert self.query is None or self.query.isActive, self.query.exception()
            samples = self.scrape()
            if check(samples):
                return samples
            time.sleep(0.5)
        raise AssertionError(f"metrics never satisfied the check: {samples}")


def serve_env(stack: Endpoints, feed: ChangeFeed, views_schema: str, tmp: Path) -> dict[str, str]:
    """The session's stack as the CLI sees it (its own home, so the dashboard shows its
    components), with this test's mirror as the only view."""
    views = {
        "TRIBUTARY_VIEWS_SCHEMA": views_schema,
        "TRIBUTARY_MIRROR_TABLES": feed.qualified,
        "TRIBUTARY_VIEWS": "",
        "TRIBUTARY_ANALYTICS": "",
        "TRIBUTARY_VIEW_CHECKPOINT_DIR": str(tmp / "checkpoints"),
        "TRIBUTARY_VIEWS_STANDBY_METRICS_PORT": "0",
    }
    if stack.local is None:
        return cli_env(stack, tmp / "home", views_schema, **views)
    return {**settings_env(stack.settings), **views}


@pytest.fixture
def window(
    spark: Any, stack: Endpoints, feed: ChangeFeed, views_schema: str, tmp_path: Path
) -> Iterator[Window]:
    config = ViewsConfig(
        kafka=stack.kafka,
        postgres_dsn=stack.postgres_dsn,
        views_schema=views_schema,
        checkpoint_root=tmp_path / "checkpoints",
        mirror_tables=(feed.qualified,),
        max_offsets_per_trigger=1000,
        trigger_interval_s=0.5,
    )
    registry = part_registry()
    batches = ViewBatchMetrics(registry)
    endpoint: MetricsEndpoint | None = serve_metrics(
        registry, "127.0.0.1", free_port_block(1), "views"
    )
    assert endpoint is not None
    port = free_port_block(1)
    env = {
        **serve_env(stack, feed, views_schema, tmp_path),
        "TRIBUTARY_VIEWS_METRICS_PORT": str(endpoint.port),
    }
    log = (tmp_path / "serve.log").open("wb")
    serve = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    win = Window(spark, config, feed, env, base, batches)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(f"{base}/ui", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "tributary serve did not answer"
            time.sleep(0.3)
        yield win
    finally:
        win.stop_view()
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait(10)
        log.close()
        endpoint.close()


def test_the_lag_of_a_stopped_view_grows_and_falls_back_after_it_restarts(
    window: Window,
) -> None:
    window.feed.run(400)
    window.start_view()
    caught_up = window.wait_metrics(lambda m: m.get("tributary_view_lag_records") == 0)
    assert caught_up["tributary_view_lag_seconds"] == 0
    assert caught_up["tributary_view_up"] == 1

    window.stop_view()
    window.feed.run(300)
    behind = window.wait_metrics(lambda m: m.get("tributary_view_lag_records", 0) > 0)
    time.sleep(2.0)
    window.feed.run(100)
    later = window.wait_metrics(
        lambda m: m.get("tributary_view_lag_records", 0) > behind["tributary_view_lag_records"]
    )
    # The oldest record the view has not applied waits longer and longer.
    assert later["tributary_view_lag_seconds"] > behind["tributary_view_lag_seconds"] + 1.5
    assert later["tributary_view_batch_id"] == behind["tributary_view_batch_id"]
    stopped_at = window.committed_batches()

    window.start_view()
    back = window.wait_metrics(lambda m: m.get("tributary_view_lag_records") == 0)
    assert back["tributary_view_lag_seconds"] == 0
    assert window.committed_batches() > stopped_at  # it caught up by applying new batches


def number(text: str) -> float:
    return float(text.replace(",", ""))


def group_offsets(kafka: Any, group: str) -> dict[str, dict[str, int]]:
    """A consumer group's committed offsets, as ``kafka-consumer-groups --describe`` reads them
    (the admin API's ListConsumerGroupOffsets)."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(kafka.client_properties())
    [future] = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
    out: dict[str, dict[str, int]] = {}
    for tp in future.result(timeout=30).topic_partitions:
        out.setdefault(tp.topic, {})[str(tp.partition)] = tp.offset
    return out


def wait_shown(window: Window, page: Any, expression: str, timeout: float) -> Any:
    """``page.wait_for`` while the view's query runs; on timeout, what the page showed."""
    deadline = time.monotonic() + timeout
    while True:
        assert window.query is None or window.query.isActive, window.query.exception()
        try:
            return page.wait_for(
                expression, timeout=min(5.0, max(0.5, deadline - time.monotonic()))
            )
        except AssertionError:
            if time.monotonic() >= deadline:
                shown = page.evaluate(SHOWN)
                reported = cli_json(window.env, "views", "--json")
                raise AssertionError(
                    f"not shown within {timeout:.0f}s; the page: {shown}; views --json: {reported}"
                ) from None


def test_the_dashboard_is_live_and_shows_what_views_json_reports(
    window: Window, stack: Endpoints, tmp_path: Path
) -> None:
    window.feed.run(300)
    window.start_view()
    view = window.view
    with Browser.launch(tmp_path) as browser:
        page = browser.open(f"{window.base}/ui")
        page.wait_for(
            f"document.querySelector('#views tr[data-view=\"{view}\"]') !== null", timeout=60
        )
        applied_now = f"Number({SHOWN}['{view}'].applied.replace(/,/g, ''))"
        first = page.wait_for(f"{applied_now} > 0 && {applied_now}")
        updates = int(page.evaluate("document.body.dataset.updates"))

        # Live: records arrive, the page follows without a reload.
        window.feed.run(300)
        total = len(window.feed.sent)
        wait_shown(window, page, f"{applied_now} === {total} && {SHOWN}['{view}'].lag === '0'", 120)
        assert total > first
        assert int(page.evaluate("document.body.dataset.updates")) > updates
        # The components of the session's stack, as `tributary status` sees them (a stack
        # the session did not start, named in the env or in containers, is not shown).
        if stack.local is not None:
            components = page.evaluate(STACK_SHOWN)
            listed = {
                str(c["name"]): c["state"]
                for c in cli_json(window.env, "status", "--json")
                if "mode" in c  # the components' rows (not the parts', cdc's or views')
            }
            assert "postgres" in listed, listed
            # The same components (each state is its own readiness probe, taken at another
            # moment: compared for PostgreSQL, which this test's workload needs up).
            assert sorted(components) == sorted(listed), (components, listed)
            assert components["postgres"] == listed["postgres"] == "up", (components, listed)

        all_shown = page.evaluate(SHOWN)
        [reported] = cli_json(window.env, "views", "--json")
        assert reported["view"] == view
        assert list(all_shown) == [view], all_shown  # the table has the one view, no other
        shown = all_shown[view]
        assert number(shown["batch_id"]) == reported["batch_id"]
        assert number(shown["lag"]) == reported["lag"] == 0
        applied = sum(o for parts in reported["offsets"].values() for o in parts.values())
        assert number(shown["applied"]) == applied == total
        assert number(shown["dead_letters"]) == 0
        # Lag tools see the view as its consumer group, at the offsets the store applied.
        assert group_offsets(window.config.kafka, view_group(view)) == reported["offsets"]

        page.wait_for("document.querySelectorAll('#lag polyline').length > 0", timeout=30)
        shot = page.screenshot(tmp_path / "operators-window.png")
    assert shot.stat().st_size > 20_000
    artifacts = os.environ.get("TRIBUTARY_TEST_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artifacts) / shot.name)
