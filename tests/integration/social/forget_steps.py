"""The forget step hook of the crash test (``TRIBUTARY_FORGET_STEP_HOOK=
tests.integration.social.forget_steps:pause``): at the step named by
``TRIBUTARY_TEST_FORGET_PAUSE_AT`` it writes that step's name to the marker file
``TRIBUTARY_TEST_FORGET_MARKER`` (whole, then renamed) and sleeps, so the test can ``kill -9``
the `tributary forget` process exactly there."""

import os
import time
from pathlib import Path


def pause(step: str) -> None:
    if step != os.environ.get("TRIBUTARY_TEST_FORGET_PAUSE_AT"):
        return
    marker = Path(os.environ["TRIBUTARY_TEST_FORGET_MARKER"])
    partial = marker.with_suffix(".part")
    partial.write_text(step)
    partial.rename(marker)
    time.sleep(3600)
