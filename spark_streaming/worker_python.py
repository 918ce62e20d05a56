"""The interpreter Spark starts its Python processes with: this one, without Spark's zips.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's source zip first on the
``PYTHONPATH`` of every Python process it starts (the driver's data-source planners and
stateful-processor workers, the daemon that forks the executors' workers). With a pip-installed
pyspark, ``SPARK_HOME`` is the package itself, so those zips hold the very sources installed
beside them — but Python imports them from the zip: it compiles every module again in every
process (zipimport keeps no bytecode), and reads the zips' directories again on each
``importlib.invalidate_caches()``. Measured on the 2-core machine: importing a streaming
source's runner took 1.6 to 1.7 s of CPU from the zips and 0.7 s from the installed package, and
Spark starts one such process per source of each query it starts.

:func:`worker_python` writes a small shell script that drops exactly those two zips (the ones
inside this interpreter's pyspark package) from ``PYTHONPATH`` and runs this interpreter. A
``SPARK_HOME`` elsewhere (another Spark's zips) is left alone.
"""

import hashlib
import os
import shlex
import sys
import tempfile
from pathlib import Path

import pyspark

SCRIPT = """#!/bin/sh
# Written by Tributary (spark_streaming/worker_python.py): run {python} without the zips of
# its own pyspark package on PYTHONPATH (the installed package has the same modules, compiled).
set -f
kept=
old_ifs=$IFS
IFS=:
for entry in ${{PYTHONPATH-}}; do
  case "$entry" in
    {lib}/*.zip) ;;
    *) kept="${{kept:+$kept:}}$entry" ;;
  esac
done
IFS=$old_ifs
PYTHONPATH=$kept
export PYTHONPATH
exec {python} "$@"
"""


def script_text(python: str = sys.executable) -> str:
    """The wrapper's text for ``python`` (its pyspark package's zips are the ones dropped)."""
    lib = Path(pyspark.__file__).resolve().parent / "python" / "lib"
    return SCRIPT.format(python=shlex.quote(python), lib=_case_pattern(str(lib)))


def worker_python(folder: Path | None = None) -> str:
    """The path of the wrapper (written once per interpreter, shared by every process that
    uses it; ``folder``: where, default the temporary directory). Where no script can be
    written or run (a read-only or ``noexec`` folder), this interpreter itself: Spark's
    processes then import from the zips, slower but the same."""
    text = script_text()
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    target = (folder or Path(tempfile.gettempdir())) / f"tributary-python-{digest}"
    try:
        if target.exists() and target.read_text() == text and os.access(target, os.X_OK):
            return _runnable(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        partial.write_text(text)
        partial.chmod(0o755)
        os.replace(partial, target)  # atomic: a process starting it sees the whole script
        return _runnable(target)
    except OSError:
        return sys.executable


def _runnable(script: Path) -> str:
    """``script``, unless its file system forbids running programs from it."""
    return sys.executable if os.statvfs(script).f_flag & os.ST_NOEXEC else str(script)


def _case_pattern(path: str) -> str:
    """``path`` as a literal in a shell ``case`` pattern (every character that globs escaped)."""
    return "".join(f"\\{c}" if not (c.isalnum() or c in "/._-") else c for c in path)
