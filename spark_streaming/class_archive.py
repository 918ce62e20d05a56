"""A class-data archive of the Spark driver's JVM (Java's AppCDS), so drivers start faster.

A Spark driver loads and verifies thousands of classes from Spark's jars before its first
query (4,700 of Spark's own for one small query). With an archive of them (written once by a
JVM that ran a small, representative Spark job with ``-XX:ArchiveClassesAtExit``), every later
driver maps them from one file: measured on the 2-core machine, a SparkSession in 4.8 s
instead of 8.2 s and the first operations in 4.4 s instead of 6.9 s. (JDK 19's
``-XX:+AutoCreateSharedArchive`` does the same on its own; Debian 12 ships JDK 17.)

The JVM checks the archive against itself and its class path when it starts: an archive of
another JDK or another Spark is skipped without a word (its log is off), never an error. A
missing archive changes nothing. ``tributary spark-archive`` writes it; ``make setup`` does.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

from spark_streaming.errors import StreamingError

BUILD_TIMEOUT_S = 600.0
# The representative job, run in a new interpreter (it starts a driver of its own).
JOB_MODULE = "spark_streaming.class_archive_job"


def default_archive() -> Path:
    """Where the archive lives unless a setting names another place: beside the interpreter's
    packages (it belongs to the installed Spark and the JDK that wrote it)."""
    return Path(sys.prefix) / "share" / "tributary" / "spark-classes.jsa"


def build_archive(archive: Path, java_options: str = "") -> float:
    """Run the representative job in a new driver that writes ``archive`` when its JVM exits
    (atomically: a reader sees the old file or the whole new one). Returns the seconds taken.
    Raises :class:`StreamingError` when the job fails or writes nothing."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f".{archive.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    began = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", JOB_MODULE, str(partial), java_options],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        partial.unlink(missing_ok=True)
        raise StreamingError(f"writing the class archive took over {exc.timeout:.0f} s") from exc
    if done.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
        partial.unlink(missing_ok=True)
        raise StreamingError(
            f"the class archive was not written (exit {done.returncode}): {done.stderr[-2000:]}"
        )
    os.replace(partial, archive)
    return time.perf_counter() - began
