"""The two subscriber examples of docs/downstream.md run as written (environment variables name
the broker, topic, group and how many records to read) and print what they read; the page
includes both files verbatim."""

import os
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import Endpoints
from tests.integration.subscribe.feed import change, post_events, produce, tombstone

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "downstream"


def _start(
    script: str, bootstrap: str, topic: str, group: str, count: int, registry: str
) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "BOOTSTRAP_SERVERS": bootstrap,
        "TOPIC": topic,
        "GROUP_ID": group,
        "MAX_RECORDS": str(count),
        "SCHEMA_REGISTRY_URL": registry,
    }
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / script)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_both_examples_run_as_written(stack: Endpoints, unique: str) -> None:
    table, aggregate = f"cdc.public.users_{unique}", f"post_{unique}"
    produce(
        stack.kafka,
        [
            change(table, 1, "c", 100, None, {"id": 1, "name": "ada"}),
            change(table, 1, "d", 110, {"id": 1, "name": "ada"}, None),
            tombstone(table, 1, 110),
        ],
        partitions=1,
    )
    produce(stack.kafka, post_events(aggregate, 2, 2, stack.settings.registry_url), partitions=1)

    registry = stack.settings.registry_url
    plain = _start(
        "plain_consumer.py", stack.bootstrap_servers, table, f"plain-{unique}", 3, registry
    )
    sdk = _start(
        "sdk_consumer.py",
        stack.bootstrap_servers,
        f"events.{aggregate}",
        f"sdk-{unique}",
        4,
        registry,
    )
    plain_events = _start(
        "plain_consumer.py",
        stack.bootstrap_servers,
        f"events.{aggregate}",
        f"plain-events-{unique}",
        4,
        registry,
    )
    plain_out, plain_err = plain.communicate(timeout=120)
    events_out, events_err = plain_events.communicate(timeout=120)
    assert plain_events.returncode == 0, events_err
    typed = [line.split(" ", 3) for line in events_out.splitlines()]
    assert [(stream, version, kind) for stream, version, kind, _ in typed] == [
        ("0", "1", "PostCreated"),
        ("1", "1", "PostCreated"),
        ("0", "2", "PostEdited"),
        ("1", "2", "PostEdited"),
    ]
    assert "'hashtags': ['kafka']" in typed[0][3] and "datetime.datetime(2026" in typed[0][3]
    # A post's text is personal: opaque bytes (ciphertext) to a reader without the key.
    assert "'text': b'tx1:" in typed[2][3] and "edit 2" not in events_out
    sdk_out, sdk_err = sdk.communicate(timeout=120)
    assert plain.returncode == 0, plain_err
    assert sdk.returncode == 0, sdk_err

    assert plain_out.splitlines() == [
        "c {'id': 1} {'id': 1, 'name': 'ada'} 100",
        "d {'id': 1} None 110",
        "tombstone {'id': 1}",
    ]
    lines = [line.split(" ", 4) for line in sdk_out.splitlines()]
    assert [(pos, stream, version, kind) for pos, stream, version, kind, _ in lines] == [
        (f"events.{aggregate}[0]@0", "0", "1", "PostCreated"),
        (f"events.{aggregate}[0]@1", "1", "1", "PostCreated"),
        (f"events.{aggregate}[0]@2", "0", "2", "PostEdited"),
        (f"events.{aggregate}[0]@3", "1", "2", "PostEdited"),
    ]
    assert "'text': b'tx1:" in lines[2][4] and "edit 2" not in sdk_out


def test_the_page_shows_both_examples_verbatim() -> None:
    page = (ROOT / "docs" / "downstream.md").read_text()
    for script in ("plain_consumer.py", "sdk_consumer.py"):
        assert (EXAMPLES / script).read_text().strip() in page, script
