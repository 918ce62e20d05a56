"""The interpreter wrapper Spark starts its Python processes with: it drops the zips of this
interpreter's own pyspark package from PYTHONPATH, keeps every other entry as it was, and runs
this interpreter with the arguments it was given."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark

from spark_streaming.worker_python import worker_python

SPARK_LIB = Path(pyspark.__file__).resolve().parent / "python" / "lib"


def run(wrapper: str, pythonpath: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    code = (
        "import json, os, sys, pyspark;"
        "print(json.dumps({'path': os.environ.get('PYTHONPATH'), 'exe': sys.executable,"
        " 'argv': sys.argv[1:], 'pyspark': pyspark.__file__}))"
    )
    done = subprocess.run(
        [wrapper, "-c", code, "a b", "*"], env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_spark_zips_are_dropped_and_every_other_entry_kept_in_order(tmp_path: Path) -> None:
    zips = sorted(str(p) for p in SPARK_LIB.glob("*.zip"))
    assert any(z.endswith("pyspark.zip") for z in zips)  # what Spark puts first
    other = [str(tmp_path / "a dir"), "/elsewhere/pyspark.zip", str(tmp_path / "g*b")]
    got = run(worker_python(tmp_path), ":".join([*zips, other[0], other[1], other[2]]))
    assert got["path"] == ":".join(other)
    assert got["exe"] == sys.executable
    assert got["argv"] == ["a b", "*"]
    # pyspark now comes from the installed package, with its compiled modules
    assert str(got["pyspark"]).startswith(str(SPARK_LIB.parent.parent))
    assert ".zip" not in str(got["pyspark"])


def test_an_unset_pythonpath_stays_empty(tmp_path: Path) -> None:
    assert run(worker_python(tmp_path), None)["path"] == ""


def test_the_script_is_written_once_and_rewritten_when_changed(tmp_path: Path) -> None:
    first = worker_python(tmp_path)
    stamp = Path(first).stat().st_mtime_ns
    assert worker_python(tmp_path) == first and Path(first).stat().st_mtime_ns == stamp
    Path(first).write_text("#!/bin/sh\nexit 3\n")
    assert worker_python(tmp_path) == first
    assert run(first, None)["exe"] == sys.executable
    assert [p.name for p in tmp_path.iterdir()] == [Path(first).name]  # no partial file left


def test_a_folder_it_cannot_write_gives_this_interpreter(tmp_path: Path) -> None:
    blocked = tmp_path / "a file"
    blocked.write_text("")
    assert worker_python(blocked / "sub") == sys.executable
