"""A SparkSession sized for Tributary's view jobs."""

import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from spark_streaming.shipping import ship
from spark_streaming.worker_python import worker_python
from tributary.jvm_archive import archive_options
from tributary.processes import pid_exists

ROCKSDB_STATE_STORE = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

# What the driver's own Python processes import: Spark starts one per streaming data source and
# per transformWithState query, and gives it 10 s (hard-coded in PythonWorkerFactory) to
# connect back. On a cold machine under load, compiling and reading these imports took longer
# ("Python worker failed to connect back"); one import while the JVM starts warms them.
WORKER_IMPORTS = (
    "pandas",
    "pyarrow",
    "pyspark.sql.streaming.python_streaming_source_runner",
    "pyspark.sql.streaming.transform_with_state_driver_worker",
    "pyspark.sql.worker.plan_data_source_read",
    "spark_streaming.kafka_source",
)
_warmed = False


def spark_session(
    master: str = "local[2]",
    app_name: str = "tributary-views",
    *,
    driver_memory: str = "1g",
    shuffle_partitions: int = 2,
    conf: Mapping[str, str] | None = None,
    local_dir: str | None = None,
    java_options: str = "",
    class_archive: Path | None = None,
) -> Any:
    """Get or create the process's SparkSession: no UI, few shuffle partitions, loopback only,
    and Python workers on this interpreter (so they import the same packages; with a local
    master, through :func:`~spark_streaming.worker_python.worker_python`). On a cluster (any
    other master) the executors import Tributary from a zip the driver ships
    (:mod:`spark_streaming.shipping`). ``conf``: more Spark properties; its
    ``spark.pyspark.python`` is the Python of every Python process Spark starts (the executors'
    and the driver host's). ``local_dir``: Spark's scratch space (block manager, shuffle),
    so a killed driver leaves its files in a folder of ours rather than in /tmp; the shipped
    zip is written under it too, and the driver JVM's temporary folder (RocksDB unpacks its
    15 MB library there at each start, and only a clean exit deletes it) is a folder of it that
    the next driver removes once its process is gone (:func:`jvm_temp_folder`).
    ``java_options``: extra JVM options of the driver and executors (e.g. C1 only and the
    serial collector: a faster start on a small machine).
    ``class_archive``: the driver maps Spark's classes from this archive when it exists
    (:mod:`spark_streaming.class_archive`)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    conf = dict(conf or {})
    named = conf.get("spark.pyspark.python")
    # Spark's Python processes import pyspark from the installed package, not from Spark's
    # zips (see worker_python): on this machine, where every one of them runs.
    python = named or (worker_python() if master.startswith("local") else sys.executable)
    # The interpreter of every Python process Spark starts, on the executors and on the driver's
    # host (the data-source planners): a SparkContext takes it from PYSPARK_PYTHON, not from
    # spark.pyspark.python, which only spark-submit reads. Named in ``conf``, it wins.
    if named:
        os.environ["PYSPARK_PYTHON"] = named
    else:
        os.environ.setdefault("PYSPARK_PYTHON", python)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", driver_memory)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.pyspark.python", python)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        # State of stateful views (windows, joins, transformWithState) in RocksDB, off-heap:
        # transformWithState needs it, and large state does not weigh on the JVM heap.
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_STATE_STORE)
        # Each commit writes the batch's changes, not a snapshot of the whole store (snapshots in
        # the background, every 10 commits): Spark's advice for stateful queries, and a
        # checkpoint written either way is read either way. The analytics test: 131 and 135 s
        # against 136 to 143 s without it.
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        # Checkpoint files on a local disk without Hadoop's .crc side files: each trigger
        # writes two small files through FileContext (offsets, commits), and the checksummed
        # local file system writes and renames a second file for each (walCommit and
        # commitOffsets about 40 % faster here). The stores hold the truth; a checkpoint that
        # disagrees with them is moved aside. Only FileContext's: RocksDB's state store needs
        # the checksummed FileSystem (it casts it to LocalFileSystem).
        .config(
            "spark.hadoop.fs.AbstractFileSystem.file.impl", "org.apache.hadoop.fs.local.RawLocalFs"
        )
    )
    driver_options = f"{java_options} {archive_options(class_archive)}".strip()
    if local_dir is not None:
        os.makedirs(local_dir, exist_ok=True)
        builder = builder.config("spark.local.dir", local_dir)
        temp = shlex.quote(f"-Djava.io.tmpdir={jvm_temp_folder(Path(local_dir))}")
        driver_options = f"{driver_options} {temp}".strip()
    if driver_options:  # (an executor on a cluster has another class path: no archive there)
        builder = builder.config("spark.driver.extraJavaOptions", driver_options)
    if java_options:
        builder = builder.config("spark.executor.extraJavaOptions", java_options)
    for key, value in conf.items():
        builder = builder.config(key, value)
    warming = _warm_worker_imports()
    session = builder.getOrCreate()
    if warming is not None:
        try:
            if warming.wait(60) == 0:
                _warm_marker().touch()
        except subprocess.TimeoutExpired:
            warming.kill()
            warming.wait()
        except OSError:  # no marker: the next driver warms them again
            pass
    session.sparkContext.setLogLevel("ERROR")
    if not master.startswith("local"):
        shipped = Path(local_dir, "shipped") if local_dir else None
        ship(session, shipped or Path(tempfile.gettempdir(), "tributary-shipped"))
    return session


def jvm_temp_folder(local_dir: Path) -> Path:
    """A temporary folder for this process's driver JVM under ``local_dir``, named by the
    process id; the folders of processes that are gone (a driver killed with SIGKILL leaves its
    files) are removed first."""
    for folder in local_dir.glob("jvm-tmp-*"):
        pid = folder.name.removeprefix("jvm-tmp-")
        if pid.isdigit() and int(pid) != os.getpid() and not pid_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
    folder = local_dir / f"jvm-tmp-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _warm_worker_imports() -> "subprocess.Popen[bytes] | None":
    """Import what Spark's Python processes import, beside the JVM's start: once per process,
    and not again after any driver of this interpreter did since the machine booted (a marker
    in the temporary folder says so: the files are then in the page cache)."""
    global _warmed
    if _warmed or _warm_marker().exists():
        return None
    _warmed = True
    code = "; ".join(f"import {module}" for module in WORKER_IMPORTS)
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


@functools.cache
def _warm_marker() -> Path:
    """The marker of imports warmed for this interpreter since the machine booted."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:  # (not Linux: once per process)
        boot = str(os.getpid())
    key = hashlib.sha256(f"{boot} {sys.executable}".encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"tributary-warmed-{key}"
