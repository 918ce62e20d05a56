"""`tributary command … --wait-views` and the Python client: a command, its result, then a wait
until every configured view reading its topic applied it (exit 3 naming the views that did not)."""

import json
import os
import random
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from event_store import Accepted
from event_store.command_topic import CommandProcessor, CommandTopics, ensure_topics
from infra.client import TributaryClient
from infra.settings import load_settings
from tests.integration.cdc_process import CdcProcess
from tests.integration.conftest import Endpoints
from tests.integration.event_store.conftest import StoreEnv
from tests.integration.kafka_reading import wait_until
from tests.integration.read_your_writes.helpers import (
    TIMELINE,
    USERS_SCHEMA_ENV,
    advance,
    hand_view,
    published_row,
)
from views.read_your_writes import PositionToken, ViewsLaggingError

Factory = Callable[..., CdcProcess]
REPO = Path(__file__).resolve().parents[3]
FACTORY = "tests.integration.read_your_writes.helpers:timeline_views"


@pytest.fixture
def processor(stack: Endpoints, unique: str, env: StoreEnv) -> Iterator[CommandTopics]:
    """The command processor on topics of this test, over the test's event store."""
    topics = CommandTopics(commands=f"commands-{unique}", results=f"command-results-{unique}")
    ensure_topics(stack.kafka, topics)
    running = CommandProcessor(env.bus(), stack.kafka, topics, consumer_name=f"proc-{unique}")
    worker = threading.Thread(target=running.run, daemon=True)
    worker.start()
    yield topics
    running.stop()
    worker.join(30)


@pytest.fixture
def cdc(env: StoreEnv, connector_factory: Factory) -> CdcProcess:
    connector = connector_factory([f"{env.schema}.events"], cdc_outbox_table=f"{env.schema}.events")
    connector.start()
    connector.wait_running()
    return connector


def _cli(
    stack: Endpoints, env: StoreEnv, topics: CommandTopics, views_schema: str, tmp: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "TRIBUTARY_HOME": str(tmp),
        "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        **stack.settings.kafka_security_env(),  # SASL/TLS of a brought Kafka
        "TRIBUTARY_SCHEMA_REGISTRY_URL": stack.settings.registry_url,
        "TRIBUTARY_POSTGRES_URL": stack.database_url,
        "TRIBUTARY_COMMANDS_TOPIC": topics.commands,
        "TRIBUTARY_COMMAND_RESULTS_TOPIC": topics.results,
        "TRIBUTARY_EVENT_STORE_SCHEMA": env.schema,
        "TRIBUTARY_VIEWS_SCHEMA": views_schema,
        "TRIBUTARY_MIRROR_TABLES": "",
        "TRIBUTARY_VIEWS": FACTORY,
    }
    environment.update(kv.split("=", 1) for kv in args if kv.startswith("TRIBUTARY_"))
    argv = [a for a in args if not a.startswith("TRIBUTARY_")]
    return subprocess.run(
        [sys.executable, "-m", "infra.cli", "command", *argv],
        env=environment,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_cli_exits_3_naming_a_view_that_never_advances_then_0_once_it_caught_up(
    stack: Endpoints,
    env: StoreEnv,
    processor: CommandTopics,
    cdc: CdcProcess,
    views_schema: str,
    tmp_path: Path,
) -> None:
    post_id = random.randrange(10**6, 10**7)
    data = json.dumps({"post_id": post_id, "author_id": 1, "text": "read me"})
    command_id = f"ryw-{post_id}"
    run = _cli(
        stack, env, processor, views_schema, tmp_path,
        "CreatePost", "--data", data, "--id", command_id, "--wait-views", "--timeout", "10",
    )  # fmt: skip
    assert run.returncode == 3, run.stderr
    result = json.loads(run.stdout)
    assert result["status"] == "accepted"
    assert result["position_token"] == f"post/post-{post_id}@1"
    assert TIMELINE in run.stderr and result["position_token"] in run.stderr

    # The view (its job is not running) catches up by hand past the event's record.
    wait_until(
        lambda: published_row(stack.postgres_dsn, env.schema, f"post-{post_id}") is not None,
        60,
        "the published row",
    )
    row = published_row(stack.postgres_dsn, env.schema, f"post-{post_id}")
    assert row is not None
    _, _, topic, partition, offset, _ = row
    timeline = hand_view(stack.postgres_dsn, views_schema, TIMELINE, ("events.post",))
    advance(timeline, {topic: {str(partition): offset + 1}}, 0)
    again = _cli(
        stack, env, processor, views_schema, tmp_path,
        "CreatePost", "--data", data, "--id", command_id, "--wait-views", "--timeout", "30",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == result  # the same command id: the first result

    rejected = _cli(
        stack, env, processor, views_schema, tmp_path,
        "EditPost", "--data", json.dumps({"post_id": post_id + 1, "text": "x"}), "--wait-views",
    )  # fmt: skip
    assert rejected.returncode == 2, rejected.stderr
    assert json.loads(rejected.stdout)["status"] == "rejected"


def test_the_cli_has_nothing_to_wait_for_without_views(
    stack: Endpoints, env: StoreEnv, processor: CommandTopics, views_schema: str, tmp_path: Path
) -> None:
    data = json.dumps({"post_id": random.randrange(10**6, 10**7), "author_id": 2, "text": "hi"})
    run = _cli(
        stack, env, processor, views_schema, tmp_path,
        "CreatePost", "--data", data, "--wait-views", "--timeout", "30", "TRIBUTARY_VIEWS=",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["position_token"].startswith("post/post-")


def test_the_client_sends_through_the_bus_and_waits_for_the_views(
    stack: Endpoints,
    env: StoreEnv,
    cdc: CdcProcess,
    views_schema: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(USERS_SCHEMA_ENV, env.users.schema or "public")
    settings = load_settings(
        home=tmp_path,
        **stack.kafka_settings,
        postgres_url=stack.database_url,
        event_store_schema=env.schema,
        views_schema=views_schema,
        mirror_tables="",
        views=FACTORY,
        command_handlers="tests.integration.read_your_writes.helpers:registry",
        schema_registry_url=stack.settings.registry_url,
    )
    post_id = random.randrange(10**6, 10**7)
    with TributaryClient(settings) as client:
        with pytest.raises(ViewsLaggingError) as caught:
            client.send(
                "CreatePost", {"post_id": post_id, "author_id": 3, "text": "t"}, wait_views=True,
                timeout=3,
            )  # fmt: skip
        assert caught.value.views == [TIMELINE]
        token = PositionToken.parse(caught.value.token)
        assert token == PositionToken("post", f"post-{post_id}", 1)

        timeline = hand_view(stack.postgres_dsn, views_schema, TIMELINE, ("events.post",))
        wait_until(
            lambda: published_row(stack.postgres_dsn, env.schema, token.stream_id) is not None,
            60,
            "the published row",
        )
        row = published_row(stack.postgres_dsn, env.schema, token.stream_id)
        assert row is not None
        catch_up = threading.Timer(0.5, advance, (timeline, {row[2]: {str(row[3]): row[4] + 1}}, 0))
        catch_up.start()
        client.wait_for(token, timeout=30)
        catch_up.join()

        rejected = client.send("EditPost", {"post_id": post_id + 1, "text": "x"}, wait_views=True)
        assert rejected.status == "rejected"
        unknown = client.send("NoSuchCommand", {})
        assert unknown.status == "rejected"
        accepted = client.send("EditPost", {"post_id": post_id, "text": "y"})
        assert isinstance(accepted, Accepted) and accepted.position_token.endswith("@2")
