"""JVM options that map a class-data archive (Java's AppCDS), shared by the Spark drivers and the
CDC part's Debezium JVM.

A JVM checks an archive against itself and its class path when it starts: an archive of another
JDK or another set of jars is skipped, never an error. With the options below it is skipped
without a word (the JVM would otherwise warn on each start). A missing archive adds nothing.
"""

import shlex
from pathlib import Path

# A stale or foreign archive is skipped silently.
QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def archive_flags(archive: Path | None) -> list[str]:
    """The JVM options, one per item, that map ``archive`` when it is a file; [] otherwise."""
    if archive is None or not archive.is_file():
        return []
    return [f"-XX:SharedArchiveFile={archive}", *QUIET]


def archive_options(archive: Path | None) -> str:
    """The same as one shell-quoted string (Spark's ``extraJavaOptions``); "" without one."""
    return " ".join(shlex.quote(flag) for flag in archive_flags(archive))
