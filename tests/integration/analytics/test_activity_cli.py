"""``tributary activity`` (the raw activity stream a front end writes) and ``tributary alerts``
in a child process against the real broker: what reaches the topic is what the command said."""

import json
import os
from pathlib import Path

from connectors.kafka.reading import read_topic
from examples.social.activity import MINUTE_MS, ActivityPlan, generate
from tests.integration.cli_process import run_tributary
from tests.integration.conftest import Endpoints


def tributary(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    done = run_tributary(env, *args)
    return done.returncode, done.stdout, " ".join(done.stderr.split())


def test_activity_commands_write_what_they_print_and_alerts_need_the_jobs(
    stack: Endpoints, unique: str, tmp_path: Path
) -> None:
    topic = f"t{unique}.activity"
    env = {
        **os.environ,
        "TRIBUTARY_HOME": str(tmp_path / "home"),
        "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        **stack.settings.kafka_security_env(),  # SASL/TLS of a brought Kafka
        "TRIBUTARY_SCHEMA_REGISTRY_URL": stack.settings.registry_url,
        "TRIBUTARY_POSTGRES_URL": stack.database_url,
        "TRIBUTARY_ACTIVITY_TOPIC": topic,
        "TRIBUTARY_ANALYTICS": "",
        "TRIBUTARY_VIEWS": "",
        "TRIBUTARY_MIRROR_TABLES": "",
    }
    start = 1_767_225_600_000
    code, out, err = tributary(
        env, "activity", "generate", "--sessions", "4", "--seed", "3", "--start-ms", str(start)
    )
    assert code == 0, err
    summary = json.loads(out)
    want = generate(ActivityPlan(sessions=4, seed=3, start_ms=start, span_ms=120 * MINUTE_MS))
    assert summary["events"] == len(want) and summary["topic"] == topic
    assert summary["searches"] + summary["clicks"] == len(want)

    code, out, err = tributary(
        env, "activity", "search", "s-cli", "7", "kafka spark", "--skew-ms=60000", "--held-ms=2000"
    )
    assert code == 0, err
    search = json.loads(out)
    assert search["type"] == "search" and search["query"] == "kafka spark"
    assert search["sent_time"] - search["received_time"] == 60_000  # the device's clock
    assert search["sent_time"] - search["event_time"] == 2_000  # held on the device
    code, out, err = tributary(
        env, "activity", "click", "s-cli", "7", search["event_id"], str(search["event_time"]), "12"
    )
    assert code == 0, err
    click = json.loads(out)
    assert click["search_id"] == search["event_id"] and click["post_id"] == 12

    records = read_topic(stack.settings.kafka("test-activity"), topic)
    written = {json.loads(r.value or b"")["event_id"]: r for r in records}
    assert set(written) == {e.event_id for e in want} | {search["event_id"], click["event_id"]}
    for event in want:
        record = written[event.event_id]
        assert record.key == event.key and json.loads(record.value or b"") == event.as_dict()
    assert json.loads(written[click["event_id"]].value or b"") == click
    assert written[search["event_id"]].key == b"s-cli"

    code, out, err = tributary(env, "alerts")
    assert code == 1 and out == ""
    assert "no view query called 'alerts'" in err and "TRIBUTARY_ANALYTICS" in err
