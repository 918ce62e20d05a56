"""Event time for analytics jobs: device clocks corrected by the three timestamps, lateness
decided per record from the data, and Spark's watermark used only to purge state.

Three timestamps (the seeds' stream-processing chapter): the time an event occurred and the
time it was sent, both by the device's clock, and the time the server received it, by the
server's clock. The device's clock is off by ``received - sent`` (network time is taken as
negligible), so the event happened at

    corrected = event + (received - sent)         (never after ``received``)

on the server's clock. A record's **delay** is ``received - corrected`` (for a device, how long
it held the event before sending it: ``sent - event`` by its own clock, skew-free). Server-side
sources (the event store, CDC) have ``sent = received``: their delay is commit time minus
domain time.

**The lateness rule** (:class:`Lateness`): a record whose delay exceeds ``allowed_ms`` is
*beyond* the allowed lateness. The decision is a property of the record alone - not of batch
boundaries, partitioning or arrival order - so a live run fed in many small micro-batches and
a replay from offset zero in one large batch keep and drop exactly the same records. Beyond
records are not silently lost: every job writes each one as an entry of its ``late``
collection (keyed by the record's identity, so a re-sent record counts once) and counts them
in a Spark metric. A kept record whose window had already closed when it arrived updates the
window: the job publishes the window again under the same key with a newer value (a
correction).

Spark's own watermark is set to ``allowed + slack`` behind the largest corrected event time
seen: it only purges state (windows, join buffers, timers) that no kept record can reach any
more. (Jobs on ``transformWithState`` hand it their rows without the event-time column, so
Spark never drops a row there; they use the watermark for timers only.) A kept record is at
most ``allowed`` behind its own receive time, so Spark can drop it only if the stream read by
one query had run more than ``slack`` ahead of that record's receive time in another
partition - choose ``slack`` above that skew; the jobs report Spark's
``numRowsDroppedByWatermark`` so a too small slack shows up instead of losing data silently.
"""

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS

LATE = "late"
"""The collection each analytics job writes its beyond-lateness records to."""

ISO_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"  # Spark's pattern for iso() (session zone UTC)


@dataclass(frozen=True)
class Lateness:
    """How late a record may be (``allowed_ms``) and how long Spark keeps state beyond that
    (``slack_ms``: the watermark is ``allowed + slack`` behind the largest event time)."""

    allowed_ms: int = 5 * MINUTE_MS
    slack_ms: int = 10 * MINUTE_MS

    def __post_init__(self) -> None:
        if self.allowed_ms < 0 or self.slack_ms < 0:
            raise ValueError(
                f"allowed lateness and slack must be >= 0 ms, got {self.allowed_ms},"
                f" {self.slack_ms}"
            )

    @property
    def watermark_delay(self) -> str:
        """The delay threshold of Spark's ``withWatermark``."""
        return f"{self.allowed_ms + self.slack_ms} milliseconds"

    def beyond(self, delay: int) -> bool:
        """Whether a record with this delay is beyond the allowed lateness."""
        return delay > self.allowed_ms

    @classmethod
    def of_seconds(cls, allowed_s: float, slack_s: float) -> "Lateness":
        return cls(round(allowed_s * 1000), round(slack_s * 1000))


# -- pure functions (references, producers, queries) -----------------------------------


def corrected_ms(event: int, sent: int, received: int) -> int:
    """The event time on the server's clock: the device's reading shifted by the device's
    offset ``received - sent``, and never later than the server received it."""
    return min(event + (received - sent), received)


def delay_ms(event: int, sent: int, received: int) -> int:
    """How long after it happened (corrected) the server received the event."""
    return received - corrected_ms(event, sent, received)


def iso_ms(ms: int) -> str:
    """Milliseconds since the epoch as ISO-8601 UTC text with milliseconds (``...000Z``)."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def parse_time(text: str) -> int:
    """ISO-8601 text (``Z`` or an offset; naive means UTC) or epoch ms as milliseconds."""
    raw = text.strip()
    if raw.lstrip("-").isdigit():
        return int(raw)
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"not a time: {text!r} (ISO-8601, e.g. 2026-01-01T12:00:00Z)") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def window_key(**parts: Any) -> str:
    """An entry key for a typed table: the JSON of its key columns, sorted, compact (the form
    the PostgreSQL store reads keys back in)."""
    return json.dumps(parts, sort_keys=True, separators=(",", ":"))


def parse_duration(text: str) -> int:
    """``90s``, ``5m``, ``1h`` or plain seconds as milliseconds."""
    raw = text.strip().lower()
    units = {"ms": 1, "s": 1000, "m": MINUTE_MS, "h": HOUR_MS}
    for suffix in ("ms", "s", "m", "h"):
        if raw.endswith(suffix) and raw[: -len(suffix)].isdigit():
            return int(raw[: -len(suffix)]) * units[suffix]
    if raw.isdigit():
        return int(raw) * 1000
    raise ValueError(f"not a duration: {text!r} (e.g. 1m, 5m, 90s)")


# -- Spark columns and frames ----------------------------------------------------------


def with_event_time(
    frame: Any,
    lateness: Lateness,
    *,
    event: str = "event_time",
    sent: str = "sent_time",
    received: str = "received_time",
) -> Any:
    """Add ``corrected_time`` (ms), ``delay_ms``, ``beyond`` (the lateness rule) and
    ``event_ts`` (the corrected time as a timestamp, the event-time column), and Spark's
    watermark on ``event_ts``. Rows without times (dead letters) get nulls."""
    from pyspark.sql import functions as F

    e, s, r = F.col(event), F.col(sent), F.col(received)
    corrected = F.least(e + (r - s), r)
    frame = (
        frame.withColumn("corrected_time", corrected)
        .withColumn("delay_ms", r - F.col("corrected_time"))
        .withColumn(
            "beyond", F.coalesce(F.col("delay_ms") > F.lit(lateness.allowed_ms), F.lit(False))
        )
        .withColumn("event_ts", F.timestamp_millis(F.col("corrected_time")))
    )
    return frame.withWatermark("event_ts", lateness.watermark_delay)


def iso(column: Any) -> Any:
    """A timestamp column as ISO-8601 UTC text with milliseconds."""
    from pyspark.sql import functions as F

    return F.date_format(column, ISO_FORMAT)


def key_json(**columns: Any) -> Any:
    """The JSON key of a typed-table entry from Spark columns (fields sorted by name, compact:
    the same text as :func:`window_key`)."""
    from pyspark.sql import functions as F

    return F.to_json(F.struct(*[columns[name].alias(name) for name in sorted(columns)]))


def folded_columns(
    *,
    collection: str | Any,
    key: Any,
    position: Any,
    fields: Any,
    deleted: Any = None,
    topic: Any = None,
    partition: Any = None,
    offset: Any = None,
) -> list[Any]:
    """The columns of a folded row (:data:`projections.folding.FOLDED_SCHEMA`): a Put of
    ``fields`` (a struct or map column, written as JSON) under ``key`` with ``position`` (or
    a Delete where ``deleted``)."""
    from pyspark.sql import functions as F

    def lit_or(value: Any, kind: str) -> Any:
        return F.lit(None).cast(kind) if value is None else value.cast(kind)

    return [
        (F.lit(collection) if isinstance(collection, str) else collection)
        .cast("string")
        .alias("collection"),
        key.cast("string").alias("key"),
        position.cast("long").alias("position"),
        (F.lit(False) if deleted is None else deleted).cast("boolean").alias("deleted"),
        F.to_json(fields).alias("fields"),
        F.lit(None).cast("string").alias("member"),
        F.lit(None).cast("array<long>").alias("changes"),
        F.lit(False).alias("fresh"),
        lit_or(topic, "string").alias("topic"),
        lit_or(partition, "int").alias("partition"),
        lit_or(offset, "long").alias("offset"),
        F.lit(None).cast("string").alias("error"),
        F.lit(None).cast("binary").alias("raw_key"),
        F.lit(None).cast("binary").alias("raw_value"),
    ]


def folded(frame: Any, **parts: Any) -> Any:
    """Folded rows from a frame (:func:`folded_columns` says which)."""
    return frame.select(*folded_columns(**parts))


def one_branch(frame: Any, outputs: list[tuple[Any, list[Any]]]) -> Any:
    """Folded rows of several kinds from one frame without branching it: each input row gives
    a row of every ``(condition, columns)`` whose condition holds (``columns`` as
    :func:`folded_columns` makes them). A union of two selects of one streaming frame would
    read its source twice per micro-batch; this reads it once."""
    from pyspark.sql import functions as F

    kinds = F.array(*[F.when(condition, F.struct(*columns)) for condition, columns in outputs])
    return (
        frame.select(F.explode(kinds).alias("out")).where(F.col("out").isNotNull()).select("out.*")
    )


def late_columns(job: str) -> tuple[Any, list[Any]]:
    """When a record is late or refused, and the columns of its folded row: a ``late`` entry
    for a record beyond the allowed lateness (key ``<kind>:<event id>``, so a re-sent record
    counts once), a rejection (a dead letter) for a record the decoder refused (``error``
    set). The frame has the columns of ``with_event_time`` plus ``kind``, ``event_id``,
    ``topic``, ``partition``, ``offset``, ``error``, ``raw_key``, ``raw_value``."""
    from pyspark.sql import functions as F

    bad = F.col("error").isNotNull()
    fields = F.struct(
        F.lit(job).alias("job"),
        F.col("kind"),
        F.col("event_id"),
        F.col("event_time"),
        F.col("sent_time"),
        F.col("received_time"),
        F.col("corrected_time"),
        F.col("delay_ms"),
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
    )
    columns = [
        F.when(bad, F.lit(None)).otherwise(F.lit(LATE)).cast("string").alias("collection"),
        F.when(bad, F.lit(None))
        .otherwise(F.concat_ws(":", F.col("kind"), F.col("event_id")))
        .cast("string")
        .alias("key"),
        F.when(bad, F.lit(None)).otherwise(F.lit(1)).cast("long").alias("position"),
        F.when(bad, F.lit(None)).otherwise(F.lit(False)).cast("boolean").alias("deleted"),
        F.when(bad, F.lit(None)).otherwise(F.to_json(fields)).alias("fields"),
        F.lit(None).cast("string").alias("member"),
        F.lit(None).cast("array<long>").alias("changes"),
        F.lit(False).alias("fresh"),
        F.col("topic").cast("string").alias("topic"),
        F.col("partition").cast("int").alias("partition"),
        F.col("offset").cast("long").alias("offset"),
        F.col("error").cast("string").alias("error"),
        F.when(bad, F.col("raw_key")).cast("binary").alias("raw_key"),
        F.when(bad, F.col("raw_value")).cast("binary").alias("raw_value"),
    ]
    return F.col("beyond") | bad, columns


def late_and_rejected(frame: Any, job: str) -> Any:
    """One stateless branch of a job's output: the rows of :func:`late_columns` for the
    frame's late and refused records. (A job whose other output comes from the same frame
    should take them in :func:`one_branch` instead: a second branch reads the source again.)"""
    condition, columns = late_columns(job)
    return frame.where(condition).select(*columns)
