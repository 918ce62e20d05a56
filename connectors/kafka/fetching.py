"""How long a fetch may wait and how many bytes it may bring, for exact range reads.

On Tansu a fetch lists the partition's stored batches until ``fetch.wait.max.ms`` is up or its
byte budget is spent, and holds the response that long even when records are there. On a
partition of many small batches (a steady producer with a short linger, CDC publishing one
transaction at a time) a short wait lists only the first few batches, and a fetch further on can
come back empty below the high watermark. So a range read starts with a short wait, asks for
about the bytes its records need (the fetch returns as soon as they are there), and, when fetches
bring nothing while records are due, reopens its consumer with a longer wait
(:data:`FETCH_WAITS_MS`). On Apache Kafka the first wait serves.
"""

SHORT_WAIT_MS = 10
"""``fetch.wait.max.ms`` of end probes and of reads that answer a waiting caller first (a store's
read, a registry's write): a probe needs only a fetch response's high watermark, and a read that
stalls with it goes on with :func:`longer_wait`."""
FETCH_WAITS_MS = (100, 500, 2_000, 10_000)
"""``fetch.wait.max.ms`` of range reads, tried in turn while fetches bring nothing."""
BYTES_PER_RECORD = 1024  # a generous guess: a budget a little short costs one more fetch
MIN_FETCH_BYTES, MAX_FETCH_BYTES = 64 * 1024, 50 * 1024 * 1024


def fetch_budget(records: int) -> dict[str, int]:
    """Fetch sizes for reading about ``records`` records (a batch larger than the budget still
    comes whole: the budget never stops a read)."""
    budget = min(MAX_FETCH_BYTES, max(MIN_FETCH_BYTES, records * BYTES_PER_RECORD))
    return {
        "fetch.max.bytes": budget,
        "max.partition.fetch.bytes": budget,
        "message.max.bytes": min(budget, 1_000_000),
    }


def range_fetch(wait_ms: int, records: int) -> dict[str, int]:
    """Consumer properties of a range read of about ``records`` records with this wait."""
    return {"fetch.wait.max.ms": wait_ms, **fetch_budget(records)}


def longer_wait(wait_ms: int) -> int:
    """The next longer fetch wait (the longest stays)."""
    longer = [w for w in FETCH_WAITS_MS if w > wait_ms]
    return longer[0] if longer else wait_ms


def shorter_wait(wait_ms: int, floor_ms: int) -> int:
    """The next shorter fetch wait, not below ``floor_ms``."""
    shorter = [w for w in FETCH_WAITS_MS if floor_ms <= w < wait_ms]
    return shorter[-1] if shorter else floor_ms


def stall_s(wait_ms: int) -> float:
    """How long a range read lets fetches bring nothing before it tries a longer wait: a few
    fetches' worth, at least one second."""
    return max(1.0, 3 * wait_ms / 1000)
