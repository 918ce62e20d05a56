"""JVM options of every Spark driver the suite starts (in-process, the test drivers and each
`tributary` child through ``TRIBUTARY_SPARK_JAVA_OPTIONS``): C1 only and the serial collector.
On two cores busy with other JVMs such a driver starts in about half the time. Each CDC part's
Debezium JVM likewise runs C1 only (``TRIBUTARY_CDC_JAVA_OPTIONS``)."""

from spark_streaming.class_archive import default_archive

SPARK_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# Every CDC part's Debezium JVM: C1 only (the engine picks G1 itself). The suite starts dozens.
CDC_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"

# The class-data archive `make setup` writes (drivers start without it when it is missing).
SPARK_CLASS_ARCHIVE = default_archive()
