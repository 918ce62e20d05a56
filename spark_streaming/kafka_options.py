"""Options of the Kafka source, with the names and meanings of Spark's Kafka connector."""

import json
import re
from dataclasses import dataclass, field
from typing import Literal

from spark_streaming.errors import SourceOptionError

EARLIEST = -2
LATEST = -1

StartingOffsets = Literal["earliest", "latest"] | dict[str, dict[str, int]]


@dataclass(frozen=True)
class KafkaSourceOptions:
    """Parsed source options.

    ``starting`` is "earliest", "latest" or per topic and partition an offset (-2 earliest,
    -1 latest), as in Spark's ``startingOffsets`` JSON. ``client`` are the ``kafka.*`` options
    without their prefix, handed to confluent-kafka.

    Options of this source only: ``tributary.fold`` names a per-partition fold
    (``module:function``, see :mod:`projections.view`) that runs inside the read task, so the
    source yields its rows instead of records: folded rows, or the rows of the Spark DDL
    ``tributary.fold.schema`` (e.g. a decoder's), with its read and fold times appended to
    the file ``tributary.stageTimes`` when that is set (benchmarks); ``tributary.skipBelow``
    (offsets JSON) makes every range start at or after those offsets (records a view's store
    already has); ``tributary.stopAt`` (offsets JSON) caps a ``trigger(availableNow=True)``
    query at those offsets, a partition it does not name at its earliest offset (a verified
    replay builds its shadow to exactly the live generation's offsets).
    """

    client: dict[str, str]
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    starting: StartingOffsets = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    poll_timeout_s: float = field(default=30.0)
    fold: str | None = None
    fold_options: dict[str, str] = field(default_factory=dict)
    fold_schema: str | None = None  # Spark DDL of the fold's rows (None: the folded schema)
    stage_times: str | None = None  # a file each read task appends its read and fold times to
    skip_below: dict[str, dict[str, int]] = field(default_factory=dict)
    stop_at: dict[str, dict[str, int]] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return self.client["bootstrap.servers"]

    def matches(self, topic: str) -> bool:
        """Whether a topic belongs to this source."""
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return topic in self.subscribe

    @classmethod
    def parse(cls, options: dict[str, str]) -> "KafkaSourceOptions":
        """Parse Spark-style options (case-insensitive keys); raises :class:`SourceOptionError`."""
        lowered = {k.lower(): v for k, v in options.items()}
        client = {
            k[len("kafka.") :]: v for k, v in options.items() if k.lower().startswith("kafka.")
        }
        if "bootstrap.servers" not in client:
            raise SourceOptionError("option kafka.bootstrap.servers is required")
        subscribe = tuple(t.strip() for t in lowered.get("subscribe", "").split(",") if t.strip())
        pattern = lowered.get("subscribepattern")
        if bool(subscribe) == bool(pattern):
            raise SourceOptionError("give exactly one of the options subscribe, subscribePattern")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise SourceOptionError(f"subscribePattern {pattern!r}: {exc}") from exc
        max_offsets = lowered.get("maxoffsetspertrigger")
        if max_offsets is not None and (not max_offsets.isdigit() or int(max_offsets) < 1):
            raise SourceOptionError(
                f"maxOffsetsPerTrigger must be a positive integer: {max_offsets}"
            )
        fail = lowered.get("failondataloss", "true").lower()
        if fail not in ("true", "false"):
            raise SourceOptionError(f"failOnDataLoss must be true or false, got {fail!r}")
        return cls(
            client=client,
            subscribe=subscribe,
            pattern=pattern,
            starting=_starting(lowered.get("startingoffsets", "latest")),
            max_offsets_per_trigger=None if max_offsets is None else int(max_offsets),
            fail_on_data_loss=fail == "true",
            poll_timeout_s=float(lowered.get("kafkaconsumer.polltimeoutms", "30000")) / 1000,
            fold=_fold(lowered.get("tributary.fold")),
            fold_options=_fold_options(lowered.get("tributary.fold.options")),
            fold_schema=(lowered.get("tributary.fold.schema") or "").strip() or None,
            stage_times=(lowered.get("tributary.stagetimes") or "").strip() or None,
            skip_below=_skip(lowered.get("tributary.skipbelow")),
            stop_at=_skip(lowered.get("tributary.stopat"), "tributary.stopAt")
            if "tributary.stopat" in lowered
            else None,
        )


def _fold(raw: str | None) -> str | None:
    if raw is None or not raw.strip():
        return None
    module, _, function = raw.strip().partition(":")
    if not module or not function:
        raise SourceOptionError(f"tributary.fold must be module:function, got {raw!r}")
    return raw.strip()


def _fold_options(raw: str | None) -> dict[str, str]:
    if raw is None or not raw.strip():
        return {}
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SourceOptionError(f"tributary.fold.options must be a JSON object: {exc}") from exc
    if not isinstance(parsed, dict):
        raise SourceOptionError("tributary.fold.options must be a JSON object of strings")
    return {str(k): str(v) for k, v in parsed.items()}


def _skip(raw: str | None, name: str = "tributary.skipBelow") -> dict[str, dict[str, int]]:
    if raw is None or not raw.strip():
        return {}
    try:
        parsed = json.loads(raw)
        return {str(t): {str(p): int(o) for p, o in parts.items()} for t, parts in parsed.items()}
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
        raise SourceOptionError(
            f'{name} must be offsets JSON like {{"topic":{{"0":23}}}}: {exc}'
        ) from exc


def _starting(raw: str) -> StartingOffsets:
    text = raw.strip()
    if text.lower() == "earliest":
        return "earliest"
    if text.lower() == "latest":
        return "latest"
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceOptionError(
            f"startingOffsets must be earliest, latest or JSON like"
            f' {{"topic":{{"0":23,"1":-2}}}}: {exc}'
        ) from exc
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise SourceOptionError('startingOffsets JSON must look like {"topic":{"0":23}}')
    out: dict[str, dict[str, int]] = {}
    for topic, parts in parsed.items():
        out[str(topic)] = {}
        for partition, offset in parts.items():
            if not isinstance(offset, int) or offset < EARLIEST:
                raise SourceOptionError(
                    f"startingOffsets {topic}[{partition}]: bad offset {offset!r}"
                )
            out[str(topic)][str(int(partition))] = offset
    return out
