"""JVM options of every Spark driver the suite starts (in-process, the test drivers and each
`tributary` child through ``TRIBUTARY_SPARK_JAVA_OPTIONS``): C1 only and the serial collector.
On two cores busy with other JVMs such a driver starts in about half the time. Each CDC part's
Debezium JVM likewise (``TRIBUTARY_CDC_JAVA_OPTIONS``)."""

from cdc.class_archive import default_archive as default_cdc_archive
from spark_streaming.class_archive import default_archive

SPARK_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# Every CDC part's Debezium JVM: C1 only, the serial collector in place of the engine's G1
# (about 0.9 CPU-s less per start). The suite starts dozens.
CDC_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# The class-data archive `make setup` writes (drivers start without it when it is missing).
SPARK_CLASS_ARCHIVE = default_archive()
CDC_CLASS_ARCHIVE = default_cdc_archive()
