"""Tributary's own code, shipped to a cluster's executors by the driver.

On a cluster the executors run the views' folds, the Kafka source's reader and the stateful
processors: Python that imports Tributary's packages. Rather than have every worker install
the package, the driver packs the packages it runs itself (:data:`PACKAGES`, the
distribution's top-level packages: the folds import across them, and so may a user's views)
into one zip of their ``.py`` files and adds it to the session
(``SparkContext.addPyFile``): each executor fetches it once and its Python workers put it on
``sys.path``. The executors' Python still needs Tributary's dependencies (pyspark, pyarrow,
pandas, confluent-kafka, fastavro...): see docs/views.md.

The zip holds the sources the driver imports (where each package is found, installed or in a
work tree), in a fixed order with fixed timestamps: the same sources make the same bytes, and
its name carries their digest (``tributary-<digest>.zip``), so a changed tree is a new file and
an unchanged one is written once.
"""

import hashlib
import importlib.util
import os
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

#: The distribution's top-level packages (pyproject.toml's package list; a unit test holds
#: the two equal).
PACKAGES = (
    "cdc",
    "connectors",
    "event_store",
    "examples",
    "infra",
    "projections",
    "spark_streaming",
    "tributary",
    "views",
)
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the zip format's earliest time: no build time in the bytes


def package_dir(name: str) -> Path | None:
    """The folder the driver imports package ``name`` from (None: not importable)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def sources(packages: Iterable[str] = PACKAGES) -> list[tuple[str, Path]]:
    """Each ``.py`` file of ``packages`` as (its name in the zip, e.g.
    ``projections/fold.py``; the file), sorted by name. A package that is not importable is
    left out (an install without the examples)."""
    entries: list[tuple[str, Path]] = []
    for name in packages:
        root = package_dir(name)
        if root is None:
            continue
        for path in root.rglob("*.py"):
            relative = path.relative_to(root)
            if "__pycache__" in relative.parts:
                continue
            entries.append(((Path(name) / relative).as_posix(), path))
    return sorted(entries)


def digest(entries: Sequence[tuple[str, bytes]]) -> str:
    """The digest of the zip's entries (names and contents): the zip's name."""
    h = hashlib.sha256()
    for name, data in entries:
        h.update(name.encode())
        h.update(b"\0")
        h.update(hashlib.sha256(data).digest())
    return h.hexdigest()[:20]


def write_zip(folder: Path, packages: Iterable[str] = PACKAGES) -> Path:
    """The zip of ``packages`` in ``folder`` (written unless a zip of the same sources is
    there), its name ``tributary-<digest>.zip``."""
    entries = [(name, path.read_bytes()) for name, path in sources(packages)]
    target = folder / f"tributary-{digest(entries)}.zip"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    # a folder without __init__.py (a namespace package: connectors/stores) is importable from a
    # zip only when the zip has an entry of its own for it
    folders = sorted({parent.as_posix() + "/" for n, _ in entries for parent in Path(n).parents})
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in folders:
            if name != "./":
                folder_info = zipfile.ZipInfo(name, date_time=_EPOCH)
                folder_info.external_attr = 0o40755 << 16
                archive.writestr(folder_info, b"")
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    os.replace(partial, target)  # atomic: a second driver sees the whole zip or none
    return target


def ship(spark: Any, folder: Path) -> Path:
    """Pack Tributary into ``folder`` and add the zip to ``spark``'s context, once: every
    executor's Python workers import Tributary from it. The driver keeps importing its own
    installation (``addPyFile`` also puts the zip first on the driver's ``sys.path``: that
    entry is taken out again)."""
    import sys

    from pyspark import SparkFiles

    archive = write_zip(folder)
    context = spark.sparkContext
    if any(Path(added).name == archive.name for added in context.listFiles):
        return archive
    context.addPyFile(str(archive))
    local = os.path.join(SparkFiles.getRootDirectory(), archive.name)
    if local in sys.path:
        sys.path.remove(local)
    return archive
