"""The CDC engine's JVM options: its class list, and a collector that replaces the engine's G1."""

from cdc.class_archive import CLASS_LIST, LEFT_OUT, trimmed
from cdc.connector import engine_java_options


def test_a_named_collector_replaces_the_engines_g1() -> None:
    assert engine_java_options("-XX:TieredStopAtLevel=1 -XX:+UseSerialGC") == [
        "-XX:-UseG1GC",
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
    ]
    assert engine_java_options("-XX:+UseParallelGC")[0] == "-XX:-UseG1GC"
    assert engine_java_options("-XX:TieredStopAtLevel=1") == ["-XX:TieredStopAtLevel=1"]
    assert engine_java_options("-XX:+UseG1GC -Xmx1g") == ["-XX:+UseG1GC", "-Xmx1g"]
    assert engine_java_options("") == []


def test_the_recorded_list_is_trimmed_of_what_is_never_archived() -> None:
    recorded = [
        "# NOTE: Do not modify this file.\n",
        "java/lang/Object id: 0\n",
        "io/debezium/engine/DebeziumEngine id: 7\n",
        "org/jpype/JPypeContext id: 8\n",
        "io/tributary/cdc/ChangeProducer id: 9\n",
        "@lambda-proxy io/debezium/heartbeat/Heartbeat run ()Ljava/lang/Runnable;\n",
        "@lambda-form-invoker [LF_RESOLVE] java.lang.invoke.Invokers$Holder invokeExact_MT L_L\n",
        "\n",
    ]
    assert list(trimmed(recorded)) == [
        "java/lang/Object id: 0",
        "io/debezium/engine/DebeziumEngine id: 7",
        "@lambda-form-invoker [LF_RESOLVE] java.lang.invoke.Invokers$Holder invokeExact_MT L_L",
    ]


def test_the_shipped_list_names_the_engines_classes_and_nothing_left_out() -> None:
    lines = CLASS_LIST.read_text().splitlines()
    names = [line for line in lines if not line.startswith("#")]
    assert not [line for line in names if any(x in line for x in LEFT_OUT)]
    assert sum(line.startswith("io/debezium/") for line in names) > 300
