"""Opening a Kafka stream: Spark's own connector when its jar is present, else ours."""

import json
import weakref
from typing import Any

from projections.view import PartitionFold, check_fold
from spark_streaming.kafka_source import SOURCE_NAME, KafkaDataSource

_SPARK_KAFKA_PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"

# Asked once per driver and registered once per session: a missing class costs a Java
# exception converted to Python, a registration pickles the source to the JVM (together
# about 1 s per view started, a quarter of a views process's start after its JVM).
_connector: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
_registered: "weakref.WeakSet[Any]" = weakref.WeakSet()


def has_spark_kafka_connector(spark: Any) -> bool:
    """Whether ``spark-sql-kafka`` is on the driver's classpath."""
    context = spark.sparkContext
    known = _connector.get(context)
    if known is None:
        try:
            context._jvm.java.lang.Class.forName(_SPARK_KAFKA_PROVIDER)
            known = True
        except Exception:
            known = False
        _connector[context] = known
    return known


def _register_source(spark: Any) -> None:
    if spark not in _registered:
        spark.dataSource.register(KafkaDataSource)
        _registered.add(spark)


def kafka_stream(spark: Any, options: dict[str, str], *, prefer_spark: bool = True) -> Any:
    """A streaming DataFrame of Kafka records (key, value, topic, partition, offset, timestamp,
    timestampType, headers) with Spark's Kafka option names."""
    if prefer_spark and has_spark_kafka_connector(spark):
        return spark.readStream.format("kafka").options(includeHeaders="true", **options).load()
    _register_source(spark)
    return spark.readStream.format(SOURCE_NAME).options(**options).load()


def records_stream(
    spark: Any, options: dict[str, str], skip_below: dict[str, dict[str, int]] | None = None
) -> Any:
    """Kafka records, without those below ``skip_below`` (records a view's store already has):
    the project's source starts its ranges there, after Spark's own source they are filtered."""
    if has_spark_kafka_connector(spark):
        records = kafka_stream(spark, options)
        condition = below_condition(skip_below or {})
        return records if condition is None else records.where(condition)
    pushed = dict(options)
    if skip_below:
        pushed["tributary.skipBelow"] = json.dumps(skip_below)
    return kafka_stream(spark, pushed, prefer_spark=False)


def folded_stream(
    spark: Any,
    options: dict[str, str],
    fold: PartitionFold,
    skip_below: dict[str, dict[str, int]] | None = None,
) -> Any:
    """Folded rows: Kafka records folded per partition by ``fold``. On the project's source
    the fold runs inside the read task, so records never travel through the JVM; after Spark's
    own source it runs as ``mapInArrow``."""
    check_fold(fold)
    if has_spark_kafka_connector(spark):
        return fold(records_stream(spark, options, skip_below))
    pushed = {**options, "tributary.fold": fold.path}
    if fold.options:
        pushed["tributary.fold.options"] = json.dumps(dict(fold.options))
    if fold.schema is not None:
        pushed["tributary.fold.schema"] = fold.schema
    return records_stream(spark, pushed, skip_below)


def below_condition(skip_below: dict[str, dict[str, int]]) -> str | None:
    """A Spark SQL condition that drops records below the given offsets (None: none to drop)."""
    clauses = []
    for topic, parts in skip_below.items():
        quoted = topic.replace("'", "''")
        for partition, offset in parts.items():
            clauses.append(
                f"(topic = '{quoted}' AND partition = {int(partition)} AND offset < {int(offset)})"
            )
    return None if not clauses else "NOT (" + " OR ".join(clauses) + ")"
