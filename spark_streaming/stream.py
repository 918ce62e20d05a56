"""Opening a Kafka stream: Spark's own connector when its jar is present, else ours."""

from typing import Any

from spark_streaming.kafka_source import SOURCE_NAME, KafkaDataSource

_SPARK_KAFKA_PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


def has_spark_kafka_connector(spark: Any) -> bool:
    """Whether ``spark-sql-kafka`` is on the driver's classpath."""
    try:
        spark.sparkContext._jvm.java.lang.Class.forName(_SPARK_KAFKA_PROVIDER)
    except Exception:
        return False
    return True


def kafka_stream(spark: Any, options: dict[str, str], *, prefer_spark: bool = True) -> Any:
    """A streaming DataFrame of Kafka records (key, value, topic, partition, offset, timestamp,
    timestampType, headers) with Spark's Kafka option names."""
    if prefer_spark and has_spark_kafka_connector(spark):
        return spark.readStream.format("kafka").options(includeHeaders="true", **options).load()
    spark.dataSource.register(KafkaDataSource)
    return spark.readStream.format(SOURCE_NAME).options(**options).load()
