"""The jobs' Spark master: as set, or (`auto`) the local stack's cluster while its master runs;
the worker count `up --spark-workers N` asked for is kept in the state folder."""

import os
import subprocess
import sys
from pathlib import Path

from infra.settings import load_settings
from infra.stack import LocalStack
from infra.stack.spark import LOCAL_MASTER, SparkMasterService, resolve_master


def test_auto_is_the_stacks_master_while_it_runs_else_local(tmp_path: Path) -> None:
    master = SparkMasterService(tmp_path, 27077, 27080)
    assert resolve_master("auto", tmp_path, 27077, 27080) == LOCAL_MASTER
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        master.pidfile.write(stand_in.pid)  # a live process under the master's pid file
        assert resolve_master("auto", tmp_path, 27077, 27080) == "spark://127.0.0.1:27077"
        assert resolve_master("spark://elsewhere:7077", tmp_path, 27077, 27080) == (
            "spark://elsewhere:7077"
        )
    finally:
        stand_in.kill()
        stand_in.wait()
    assert resolve_master("auto", tmp_path, 27077, 27080) == LOCAL_MASTER  # it died
    assert resolve_master(LOCAL_MASTER, tmp_path, 27077, 27080) == LOCAL_MASTER


def test_the_worker_count_is_kept_for_later_commands(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path / "state", spark_master_port=27077)
    assert LocalStack(settings).spark == []  # no cluster unless asked
    asked = LocalStack(settings, spark_workers=3)
    asked._resize_spark(3)  # what `up --spark-workers 3` records before it starts them
    later = LocalStack(settings)  # `status`, `down`, a plain `up`
    names = [svc.name for svc in later.services]
    assert names[-4:] == ["spark-master", "spark-worker-0", "spark-worker-1", "spark-worker-2"]
    assert [w.port for w in later.spark_workers] == [27087, 27088, 27089]
    LocalStack(settings, spark_workers=0)._resize_spark(0)
    assert LocalStack(settings).spark == []
    assert os.listdir(tmp_path / "state" / "spark-master") == []


def test_the_master_and_workers_get_the_spark_jvm_options(tmp_path: Path) -> None:
    options = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    settings = load_settings(home=tmp_path / "state", spark_java_options=options)
    stack = LocalStack(settings, spark_workers=1)
    assert [svc.env()["SPARK_DAEMON_JAVA_OPTS"] for svc in stack.spark] == [options, options]
    plain = LocalStack(load_settings(home=tmp_path / "plain", spark_java_options=""), 1)
    assert all("SPARK_DAEMON_JAVA_OPTS" not in svc.env() for svc in plain.spark)
