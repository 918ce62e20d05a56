"""Where a machine's CPU went during a benchmark: CPU seconds per part of the stack, read from
``/proc`` (user + system time of every process, grouped by what its command line runs)."""

import os
from collections import Counter
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")

#: (label, what the command line holds), first match wins
PARTS: tuple[tuple[str, str], ...] = (
    ("broker (tansu)", "tansu"),
    ("object store (weed)", "weed"),
    ("postgres", "postgres"),
    ("redis", "redis-server"),
    ("views: Spark JVM", "SparkSubmit"),
    ("views: Spark Python workers", "tributary-python-"),
    ("views: Spark Python workers", "pyspark.daemon"),
    ("views: Spark Python workers", "pyspark.worker"),
    ("cdc (Python + Debezium JVM)", "infra.cli run cdc"),
    ("command processor", "infra.cli run commands"),
    ("views: driver (Python)", "infra.cli run views"),
    ("bench: recorders", "multiprocessing.spawn"),
    ("bench: senders", "bench/"),
)


def _label(cmdline: str) -> str:
    for label, needle in PARTS:
        if needle in cmdline:
            return label
    return "other processes"


def snapshot() -> dict[int, tuple[str, float]]:
    """Per live process: its part and the CPU seconds it has used."""
    out: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        used = (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
        out[int(entry.name)] = (_label(cmdline) if cmdline else "other processes", used)
    return out


def used_between(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> Counter[str]:
    """CPU seconds per part between two snapshots (a process that started in between counts
    from zero; one that ended in between is not seen)."""
    parts: Counter[str] = Counter()
    for pid, (label, used) in after.items():
        was = before.get(pid)
        parts[label] += used - (was[1] if was is not None and was[0] == label else 0.0)
    return parts


def report(parts: Counter[str], seconds: float) -> list[str]:
    """Lines: each part's CPU seconds and its share of what the machine's cores offered."""
    cores = os.cpu_count() or 1
    offered = cores * seconds
    lines = [f"CPU over {seconds:.1f}s on {cores} cores ({offered:.1f} CPU s offered):"]
    for label, used in parts.most_common():
        lines.append(f"  {label:<30}{used:>8.1f} s {used / offered:>7.1%}")
    total = sum(parts.values())
    lines.append(f"  {'all':<30}{total:>8.1f} s {total / offered:>7.1%}")
    return lines
