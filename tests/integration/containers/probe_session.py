"""Not collected by the suite (not ``test_*``): run alone by test_containers.py, in a session of
its own, with ``TRIBUTARY_TEST_STACK=containers``. Its one test writes the marker file once the
stack is up, waits for the go file (the caller has seen the stack's containers), then fails
(``fail``), interrupts itself (``sigint``) or waits to be signalled."""

import os
import signal
import time
from pathlib import Path

from tests.integration.conftest import Endpoints


def test_probe(stack: Endpoints) -> None:
    assert stack.containers is not None
    Path(os.environ["TRIBUTARY_TEST_PROBE_MARKER"]).write_text(stack.containers.stack_id)
    mode = os.environ["TRIBUTARY_TEST_PROBE_MODE"]
    go = Path(os.environ["TRIBUTARY_TEST_PROBE_MARKER"] + ".go")
    deadline = time.monotonic() + 120
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    if mode == "sigint":
        os.kill(os.getpid(), signal.SIGINT)
    if mode != "fail":
        time.sleep(120)  # signalled meanwhile
    raise AssertionError("the probe's test fails")
