"""Dead letters handled: `tributary dlq list | show | redrive` against the real broker, Redis,
PostgreSQL and Spark. A record of a shape the view does not know is dead-lettered; the view is
fixed (an upcaster added); the redrive re-feeds it and the view holds it once; a second
redrive changes nothing, and a copy that arrives anyway (a redrive that crashed before its
ledger) is dropped by the view's position guard."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from connectors.kafka import TopicAdmin, history_topic, state_topic
from connectors.kafka.producing import idempotent_producer
from projections.view import DeadLetter, View
from spark_streaming.view_job import BatchReport, ViewJob
from tests.integration.conftest import Endpoints
from tests.integration.operations import legacy_views
from tests.integration.operations.conftest import cli, cli_env, cli_json
from views.catalog import ViewsConfig, configured_views
from views.dead_letters import DeadLetterQueue, dlq_topic

STRICT = "tests.integration.operations.legacy_views:strict"
FIXED = "tests.integration.operations.legacy_views:fixed"


@pytest.fixture
def items(stack: Endpoints, views_schema: str, tmp_path: Path) -> Iterator[ViewsConfig]:
    config = ViewsConfig(
        kafka=stack.kafka,
        postgres_dsn=stack.postgres_dsn,
        views_schema=views_schema,
        checkpoint_root=tmp_path / "checkpoints",
        redis_url=stack.redis_url,
        view_factories=(STRICT,),
    )
    name, topic = legacy_views.names(config)
    TopicAdmin(stack.kafka).ensure(history_topic(topic, 2))
    yield config
    TopicAdmin(stack.kafka).delete(topic, dlq_topic(name))
    client = redis.Redis.from_url(stack.redis_url)
    keys = list(client.scan_iter(match=f"tributary:{name}*"))
    if keys:
        client.delete(*keys)
    client.close()


def produce(config: ViewsConfig, records: list[dict[str, Any]]) -> None:
    _, topic = legacy_views.names(config)
    producer = idempotent_producer(config.kafka)
    for record in records:
        producer.produce(topic, key=str(record["id"]).encode(), value=json.dumps(record).encode())
    assert producer.flush(30) == 0


def run(spark: Any, view: View, config: ViewsConfig) -> list[BatchReport]:
    reports: list[BatchReport] = []
    job = ViewJob(spark, view, config.kafka, config.job_options(), on_batch=reports.append)
    query = job.start(available_now=True)
    query.awaitTermination(300)
    assert query.exception() is None
    job.close()
    return reports


def release(config: ViewsConfig, factory: str) -> View:
    from dataclasses import replace

    [view] = configured_views(replace(config, view_factories=(factory,))).values()
    return view


def test_a_dead_letter_redriven_after_the_fix_is_applied_once(
    spark: Any, stack: Endpoints, items: ViewsConfig, views_schema: str, tmp_path: Path
) -> None:
    name, topic = legacy_views.names(items)
    produce(items, [{"id": n, "name": f"item {n}", "version": 1} for n in range(1, 31)])
    produce(items, [{"shape": 2, "id": 31, "label": "item 31, new shape", "version": 1}])
    produce(items, [{"id": 7, "name": "item 7 renamed", "version": 2}])
    strict = release(items, STRICT)
    assert sum(r.rejected for r in run(spark, strict, items)) == 1
    assert strict.store.get("items", "31") is None
    assert strict.store.get("items", "7").fields["name"] == "item 7 renamed"  # type: ignore[union-attr]

    env = cli_env(stack, tmp_path / "home", views_schema, TRIBUTARY_VIEWS=STRICT)
    [listed] = cli_json(env, "dlq", "list", name, "--json")
    assert listed["stage"] == "decode" and "unknown shape 2" in listed["reason"]
    assert listed["source"].startswith(f"{topic}:") and listed["redrive"] is None
    shown = cli_json(env, "dlq", "show", name, listed["id"])
    assert json.loads(shown["value"])["label"] == "item 31, new shape"

    # The fix: the view's next release upcasts shape 2. Then the redrive.
    env["TRIBUTARY_VIEWS"] = FIXED
    [first] = cli_json(env, "dlq", "redrive", name, "--json")
    assert first["outcome"] == "redriven" and first["target"].startswith(f"{topic}:")
    ends = TopicAdmin(items.kafka).end_offsets(topic)
    fixed = release(items, FIXED)
    run(spark, fixed, items)
    entry = fixed.store.get("items", "31")
    assert entry is not None and entry.fields == {"id": 31, "name": "item 31, new shape"}
    assert entry.applied == 1

    # A second redrive sends nothing: the ledger knows the dead letter.
    [second] = cli_json(env, "dlq", "redrive", name, "--json")
    assert second["outcome"] == "already redriven" and second["target"] is None
    assert TopicAdmin(items.kafka).end_offsets(topic) == ends
    [after] = cli_json(env, "dlq", "list", name, "--json")
    assert after["redrive"] == "redriven"
    # A copy that arrives anyway (a redrive that died before writing its ledger) changes
    # nothing: the view's position guard has the item at that version.
    produce(items, [{"shape": 2, "id": 31, "label": "item 31, new shape", "version": 1}])
    run(spark, fixed, items)
    again = fixed.store.get("items", "31")
    assert again is not None and (again.applied, again.fields) == (1, entry.fields)

    unknown = cli(env, "dlq", "redrive", name, "--ids", "0:999", check=False)
    assert unknown.returncode == 1 and "no dead letter 0:999" in unknown.stderr


def test_a_dead_letter_of_a_state_topic_superseded_by_a_later_change_is_not_appended(
    stack: Endpoints, views_schema: str, tmp_path: Path, unique: str
) -> None:
    """Appending an old change after a newer one of its key would make compaction keep the
    old one: such a dead letter is recorded as superseded, and nothing is produced."""
    from views.redrive import RedriveLedger, dead_letters, redrive

    topic, view = f"cdc.state_{unique}", f"state_{unique}"
    admin = TopicAdmin(stack.kafka)
    admin.ensure(state_topic(topic, 1))
    producer = idempotent_producer(stack.kafka)
    for key, value in [(b"1", b"old"), (b"2", b"only"), (b"1", b"new")]:
        producer.produce(topic, key=key, value=value, partition=0)
    assert producer.flush(30) == 0
    queue = DeadLetterQueue(stack.kafka, view)
    queue.send(
        [
            DeadLetter(topic, 0, 0, b"1", b"old", "refused", "write"),
            DeadLetter(topic, 0, 1, b"2", b"only", "refused", "write"),
        ]
    )
    try:
        ledger = RedriveLedger(stack.postgres_dsn, views_schema)
        letters = dead_letters(stack.kafka, view)
        outcomes = {o.id: o for o in redrive(stack.kafka, ledger, view, letters)}
        assert outcomes["0:0"].outcome == "superseded" and f"{topic}:0:2" in outcomes["0:0"].detail
        assert outcomes["0:1"].outcome == "redriven" and outcomes["0:1"].target == f"{topic}:0:3"
        assert admin.end_offsets(topic) == {0: 4}
        again = redrive(stack.kafka, ledger, view, letters)
        assert [o.outcome for o in again] == ["already redriven", "already redriven"]
        assert admin.end_offsets(topic) == {0: 4}
    finally:
        admin.delete(topic, dlq_topic(view))
