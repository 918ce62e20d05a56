"""Topic administration: create-if-absent with a settings check, and a listing with true ends."""

from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
)

from connectors.errors import KafkaError, TopicConfigMismatchError
from connectors.kafka.config import KafkaConfig
from connectors.kafka.offsets import TrueEnds, probe_consumer, true_watermarks
from connectors.kafka.topics import TopicSpec


@dataclass(frozen=True)
class PartitionInfo:
    """One partition: its id and the offsets of its first and next record."""

    partition: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True)
class TopicInfo:
    """A topic as the broker reports it."""

    name: str
    partitions: tuple[PartitionInfo, ...]
    cleanup_policy: str | None

    @property
    def records(self) -> int:
        """Offsets spanned across partitions (records, plus transaction markers if any)."""
        return sum(p.end_offset - p.start_offset for p in self.partitions)

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "partitions": len(self.partitions),
            "cleanup_policy": self.cleanup_policy,
            "end_offsets": {str(p.partition): p.end_offset for p in self.partitions},
            "start_offsets": {str(p.partition): p.start_offset for p in self.partitions},
        }


def error_code(exc: Exception) -> str | None:
    """librdkafka's error name carried by a KafkaException, if any."""
    err = exc.args[0] if exc.args else None
    name = getattr(err, "name", None)
    return str(name()) if callable(name) else None


def _raise(message: str, exc: Exception) -> KafkaError:
    err = exc.args[0] if exc.args else None
    text = getattr(err, "str", None)
    return KafkaError(f"{message}: {text() if callable(text) else exc}", error_code(exc))


KAFKA_TOPIC_DEFAULTS = {"cleanup.policy": "delete"}
"""Kafka's own defaults of the topic settings Tributary checks."""


class TopicAdmin:
    """Creates, checks, describes and lists topics."""

    def __init__(self, config: KafkaConfig, timeout: float | None = None) -> None:
        self._config = config
        self._timeout = config.admin_timeout_s if timeout is None else timeout
        try:
            self._admin = AdminClient(config.client_properties())
        except KafkaException as exc:  # a property librdkafka refuses, a key it cannot load
            raise _raise(
                "cannot create a Kafka client (check TRIBUTARY_KAFKA_SECURITY_PROTOCOL and the"
                " TRIBUTARY_KAFKA_SASL_* / TRIBUTARY_KAFKA_SSL_* / TRIBUTARY_KAFKA_EXTRA settings)",
                exc,
            ) from exc

    def topic_names(self) -> list[str]:
        try:
            md = self._admin.list_topics(timeout=self._timeout)
        except KafkaException as exc:
            raise _raise(
                f"cannot reach Kafka at {self._config.bootstrap_servers} "
                "(is the stack up? run `tributary up`)",
                exc,
            ) from exc
        return sorted(t for t in md.topics if not t.startswith("__"))

    def partition_count(self, name: str) -> int | None:
        # Never ask metadata for one named topic: brokers with auto-creation on create it.
        try:
            md = self._admin.list_topics(timeout=self._timeout)
        except KafkaException as exc:
            raise _raise(f"cannot reach Kafka at {self._config.bootstrap_servers}", exc) from exc
        topic = md.topics.get(name)
        if topic is None or topic.error is not None or not topic.partitions:
            return None
        return len(topic.partitions)

    def configs(self, name: str) -> dict[str, str]:
        resource = ConfigResource(ConfigResource.Type.TOPIC, name)
        try:
            result = self._admin.describe_configs([resource])[resource].result(self._timeout)
        except KafkaException as exc:
            raise _raise(f"cannot describe topic {name}", exc) from exc
        return {key: entry.value for key, entry in result.items() if entry.value is not None}

    def ensure(self, spec: TopicSpec) -> bool:
        """Create the topic if absent (True); otherwise check it matches the spec (False).

        Raises :class:`TopicConfigMismatchError` naming each difference.
        """
        existing = self.partition_count(spec.name)
        if existing is None:
            future = self._admin.create_topics(
                [NewTopic(spec.name, spec.partitions, 1, config=spec.topic_configs())]
            )[spec.name]
            try:
                future.result(self._timeout)
                return True
            except TimeoutError as exc:  # concurrent.futures' (the builtin since 3.11)
                raise KafkaError(
                    f"the broker at {self._config.bootstrap_servers} did not create topic "
                    f"{spec.name} within {self._timeout:g} s (is its storage writable? a broker "
                    "on SeaweedFS hangs when the disk is nearly full)",
                    "_TIMED_OUT",
                ) from exc
            except KafkaException as exc:
                if error_code(exc) != "TOPIC_ALREADY_EXISTS":
                    raise _raise(f"cannot create topic {spec.name}", exc) from exc
                existing = self.partition_count(spec.name)
        self.check(spec, existing)
        return False

    def check(self, spec: TopicSpec, partitions: int | None = None) -> None:
        partitions = self.partition_count(spec.name) if partitions is None else partitions
        problems = []
        if partitions != spec.partitions:
            problems.append(f"partitions is {partitions}, expected {spec.partitions}")
        # A setting the broker does not report is the broker's default (a topic created by a
        # producer's first send on a broker that auto-creates topics).
        actual = {**KAFKA_TOPIC_DEFAULTS, **self.configs(spec.name)}
        for key, wanted in spec.topic_configs().items():
            if actual.get(key) != wanted:
                problems.append(f"{key} is {actual.get(key)!r}, expected {wanted!r}")
        if problems:
            raise TopicConfigMismatchError(
                f"topic {spec.name} exists with other settings: {'; '.join(problems)}. "
                "Alter the topic (kafka-configs / kafka-topics --alter) or delete it, then retry."
            )

    def delete(self, *names: str) -> None:
        if not names:
            return
        for name, future in self._admin.delete_topics(list(names)).items():
            try:
                future.result(self._timeout)
            except KafkaException as exc:
                raise _raise(f"cannot delete topic {name}", exc) from exc

    def describe(
        self,
        names: list[str] | None = None,
        *,
        known: TrueEnds | None = None,
        policies: dict[str, str | None] | None = None,
    ) -> list[TopicInfo]:
        """Topics with partitions, true start/end offsets and cleanup.policy. A caller that
        asks again and again (a dashboard) passes ``known`` (true ends remembered, see
        :class:`~connectors.kafka.offsets.TrueEnds`) and ``policies`` (each topic's policy,
        asked once)."""
        names = self.topic_names() if names is None else names
        md = self._admin.list_topics(timeout=self._timeout)
        wanted = [(n, sorted(md.topics[n].partitions)) for n in names if n in md.topics]
        consumer = probe_consumer(self._config)
        try:
            marks = true_watermarks(
                consumer,
                [(n, p) for n, parts in wanted for p in parts],
                self._timeout,
                fresh=lambda: probe_consumer(self._config),
                known=known,
            )
        finally:
            consumer.close()
        cache = {} if policies is None else policies
        for name, _ in wanted:
            if name not in cache:
                cache[name] = self.configs(name).get("cleanup.policy")
        return [
            TopicInfo(
                name=name,
                partitions=tuple(
                    PartitionInfo(p, marks[(name, p)][0], marks[(name, p)][1]) for p in parts
                ),
                cleanup_policy=cache[name],
            )
            for name, parts in wanted
        ]

    def end_offsets(self, name: str) -> dict[int, int]:
        [info] = self.describe([name])
        return {p.partition: p.end_offset for p in info.partitions}
