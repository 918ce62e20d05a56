"""Batch errors in brief: the text Spark matches with its per-character recursive regex stays
short and never holds the phrase that starts the match."""

import pytest

from spark_streaming.errors import StreamingError
from spark_streaming.view_job import SUMMARY_CHARS, batch_errors_in_brief, java_summary


class Py4JJavaError(Exception):
    """Named as py4j's: the wrapper goes by the name in the traceback text."""


def test_the_summary_names_each_exception_of_the_chain_by_its_first_and_last_line() -> None:
    try:
        try:
            raise ValueError("first line\n" + "middle\n" * 5000 + "StreamingError: the cause")
        except ValueError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as exc:
        summary = java_summary(exc)
    assert summary == "RuntimeError: outer <- ValueError: first line ... StreamingError: the cause"


def test_errors_through_the_jvm_leave_short_and_without_the_phrase() -> None:
    def fail(batch: object, batch_id: int) -> None:
        raise Py4JJavaError("An error occurred while calling o1.x.\n" + "\tat Frame\n" * 10_000)

    with pytest.raises(StreamingError) as caught:
        batch_errors_in_brief(fail, "view v")(None, 7)
    text = str(caught.value)
    assert text.startswith("view v: batch 7 failed: Py4JJavaError - An error occurred while")
    assert len(text) < SUMMARY_CHARS + 40
    assert caught.value.__suppress_context__


def test_other_errors_pass_unchanged() -> None:
    def fail(batch: object, batch_id: int) -> None:
        raise KeyError("plain")

    with pytest.raises(KeyError):
        batch_errors_in_brief(fail)(None, 0)
