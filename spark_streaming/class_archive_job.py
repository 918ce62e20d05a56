"""The representative Spark job whose classes go into the driver's class-data archive
(:mod:`spark_streaming.class_archive` runs it as ``python -m`` in a new driver, which writes
the archive when its JVM exits)."""

import shlex
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spark_streaming.class_archive import BUILD_TIMEOUT_S
from spark_streaming.errors import StreamingError
from spark_streaming.session import spark_session


def _record(partial: Path, java_options: str) -> None:
    """The job whose classes are archived: a batch query with a Python function over Arrow,
    and a streaming query from a Python data source through ``foreachBatch`` (the view jobs'
    path). Then the JVM exits, and writes the archive as it does."""
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
