"""A Kafka Connect worker's handling of a connector's records, in this process.

Debezium's embedded engine (pydbzengine, ``format="connect"``) runs the connector with the
given configuration and applies its transforms (``transforms``, ``predicates``); this applies
the configured key, value and header converters to the ``SourceRecord``\\ s it hands over, as
a Connect worker does before producing them. The records are collected, not produced.
"""

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdc.connector import LOG4J  # the embedded connector's log set-up

#: (topic, key bytes, value bytes, headers)
Record = tuple[str, bytes | None, bytes | None, dict[str, bytes | None]]


class ConnectWorker:
    """The converters a connector's configuration names, configured with its sub-properties."""

    def __init__(self, config: dict[str, str]) -> None:
        self.key = self._converter(config, "key.converter")
        self.key.configure(self._sub(config, "key.converter"), True)
        self.value = self._converter(config, "value.converter")
        self.value.configure(self._sub(config, "value.converter"), False)
        self.header = None
        if "header.converter" in config:
            self.header = self._converter(config, "header.converter")
            self.header.configure(self._sub(config, "header.converter"))

    @staticmethod
    def _converter(config: dict[str, str], prefix: str) -> Any:
        import jpype

        return jpype.JClass(config[prefix])()

    @staticmethod
    def _sub(config: dict[str, str], prefix: str) -> Any:
        import jpype

        start = len(prefix) + 1
        found = {k[start:]: v for k, v in config.items() if k.startswith(prefix + ".")}
        return jpype.JClass("java.util.HashMap")(found)

    def convert(self, record: Any) -> Record:
        """As a Connect worker does: the headers first (into Kafka record headers, which the
        value converter is given), then the key and the value."""
        import jpype

        topic = str(record.topic())
        headers: dict[str, bytes | None] = {}
        kafka_headers = jpype.JClass("org.apache.kafka.common.header.internals.RecordHeaders")()
        if self.header is not None:
            for header in record.headers():
                raw = self.header.fromConnectHeader(
                    topic, header.key(), header.schema(), header.value()
                )
                kafka_headers.add(header.key(), raw)
                headers[str(header.key())] = None if raw is None else bytes(raw)
        key = self.key.fromConnectData(topic, record.keySchema(), record.key())
        value = self.value.fromConnectData(
            topic, kafka_headers, record.valueSchema(), record.value()
        )
        return (
            topic,
            None if key is None else bytes(key),
            None if value is None else bytes(value),
            headers,
        )


def run_connect_path(
    config: dict[str, str],
    state: Path,
    until: Callable[[list[Record]], bool],
    timeout: float = 90,
) -> list[Record]:
    """Run the connector ``config`` (plus the embedded engine's file offset store) until
    ``until(records)`` holds or ``timeout`` passed; the converted records."""
    from pydbzengine import BasePythonChangeHandler, DebeziumEngine
    from pydbzengine.engine.jvm import ensure_jvm_started

    state.mkdir(parents=True, exist_ok=True)
    log4j = state / "log4j2.properties"
    log4j.write_text(LOG4J.format(log_file=state / "debezium.log"))
    # -Xrs: signals stay Python's. Only the first start's options apply (one JVM a process).
    ensure_jvm_started(jvm_opts=["-Xrs", "-Xmx384m", f"-Dlog4j2.configurationFile={log4j}"])
    worker = ConnectWorker(config)
    converted: list[Record] = []
    done, reached = threading.Event(), threading.Event()

    class Handler(BasePythonChangeHandler):
        def handleJsonBatch(self, records: list[Any]) -> None:  # pydbzengine's names
            # With the Connect format each change carries the transformed SourceRecord.
            converted.extend(worker.convert(r.sourceRecord()) for r in records)
            if until(converted):
                reached.set()
                done.set()

    properties = {
        **config,
        "name": config["slot.name"],
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(state / "offsets"),
        "offset.flush.interval.ms": "0",
    }
    engine = DebeziumEngine(properties=properties, handler=Handler(), format="connect")
    failure: list[BaseException] = []

    def work() -> None:
        try:
            engine.run()
        except BaseException as exc:
            failure.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=work, name="connect-path", daemon=True)
    thread.start()
    done.wait(timeout)
    engine.close()
    thread.join(30)
    # Closing the engine as soon as the records are in can interrupt the commit of that
    # batch (an InterruptedException out of run()): only a failure before then counts.
    if failure and not reached.is_set():
        raise AssertionError(f"the engine failed: {failure[0]} (log: {state / 'debezium.log'})")
    return list(converted)
