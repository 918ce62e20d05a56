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
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spark_streaming.errors import StreamingError

# A stale or foreign archive is skipped silently (the JVM would otherwise warn on each start).
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
BUILD_TIMEOUT_S = 600.0


def default_archive() -> Path:
    """Where the archive lives unless a setting names another place: beside the interpreter's
    packages (it belongs to the installed Spark and the JDK that wrote it)."""
    return Path(sys.prefix) / "share" / "tributary" / "spark-classes.jsa"


def archive_options(archive: Path | None) -> str:
    """The JVM options that map ``archive`` when it exists; "" when it does not."""
    if archive is None or not archive.is_file():
        return ""
    return f"-XX:SharedArchiveFile={shlex.quote(str(archive))} {QUIET}"


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
            [sys.executable, "-m", __name__, str(partial), java_options],
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


def _record(partial: Path, java_options: str) -> None:
    """The job whose classes are archived: a batch query with a Python function over Arrow,
    and a streaming query from a Python data source through ``foreachBatch`` (the view jobs'
    path). Then the JVM exits, and writes the archive as it does."""
    from spark_streaming.session import spark_session

    options = f"{java_options} -XX:ArchiveClassesAtExit={shlex.quote(str(partial))}".strip()
    with tempfile.TemporaryDirectory(prefix="tributary-class-archive-") as scratch:
        spark = spark_session(
            "local[2]", "tributary-class-archive", local_dir=scratch, java_options=options
        )
        jvm = spark.sparkContext._gateway.proc
        _exercise(spark, Path(scratch))
        spark.stop()
        jvm.stdin.close()  # the gateway exits at the end of its input
        jvm.wait(BUILD_TIMEOUT_S)


def _exercise(spark: Any, scratch: Path) -> None:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class Numbers(DataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:
            return {"n": 0}

        def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
            return {"n": 100}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Any]:
            return [InputPartition(i) for i in range(2)]

        def read(self, partition: Any) -> Iterator[tuple[int, str]]:
            for i in range(50):
                yield (i, f"row {partition.value}-{i}")

    class NumbersSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "tributary_class_archive"

        def schema(self) -> str:
            return "n int, text string"

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return Numbers()

    def double(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:  # through Arrow and back, as a view's fold goes
            yield batch.filter(batch.column(0).is_valid())

    spark.range(1000).selectExpr("id % 7 AS k", "id").groupBy("k").count().collect()
    spark.range(100).selectExpr("CAST(id AS INT) AS n", "'x' AS text").mapInArrow(
        double, "n int, text string"
    ).collect()
    spark.dataSource.register(NumbersSource)
    seen: list[int] = []
    query = (
        spark.readStream.format(NumbersSource.name())
        .load()
        .mapInArrow(double, "n int, text string")
        .writeStream.foreachBatch(lambda batch, _: seen.append(len(batch.toArrow())))
        .option("checkpointLocation", str(scratch / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if sum(seen) != 100:
        raise StreamingError(f"the class archive's job read {sum(seen)} rows of 100")


if __name__ == "__main__":
    _record(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "")
