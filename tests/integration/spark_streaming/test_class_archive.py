"""The class-data archive `make setup` writes is the one a driver maps its classes from."""

import subprocess
import sys
from pathlib import Path

from tests.jvm import SPARK_CLASS_ARCHIVE, SPARK_JAVA_OPTIONS

DRIVER = """
import sys
from pathlib import Path
from spark_streaming.session import spark_session
spark = spark_session(
    app_name="archive-check", java_options=sys.argv[1], class_archive=Path(sys.argv[2])
)
assert spark.range(100).count() == 100
spark.stop()
"""


def test_a_driver_loads_most_of_sparks_classes_from_the_archive(tmp_path: Path) -> None:
    assert SPARK_CLASS_ARCHIVE.is_file(), f"{SPARK_CLASS_ARCHIVE} is missing: run `make setup`"
    loaded = tmp_path / "classes.log"
    options = f"{SPARK_JAVA_OPTIONS} -Xshare:on -Xlog:class+load=info:file={loaded}"
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, options, str(SPARK_CLASS_ARCHIVE)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # Spark's classes from its jars or from the archive (lambdas and generated code are made
    # at run time, in both cases)
    spark = [
        line
        for line in loaded.read_text().splitlines()
        if " org.apache.spark." in line
        and ("source: file:" in line or "source: jar:" in line or "shared objects" in line)
    ]
    from_archive = [line for line in spark if "shared objects file (top)" in line]
    # -Xshare:on: a JVM that cannot map the archive does not start at all.
    assert len(from_archive) > 3000, (len(from_archive), len(spark))
    assert len(from_archive) > 0.9 * len(spark), (len(from_archive), len(spark))
