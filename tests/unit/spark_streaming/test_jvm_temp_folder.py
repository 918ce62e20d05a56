import os
import subprocess
import sys
from pathlib import Path

from spark_streaming.session import jvm_temp_folder


def test_the_folders_of_gone_drivers_go_and_the_living_ones_stay(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    living = os.getppid()
    for pid in (gone.pid, living):
        (tmp_path / f"jvm-tmp-{pid}").mkdir()
        (tmp_path / f"jvm-tmp-{pid}" / "librocksdbjni123.so").write_bytes(b"\0" * 16)
    (tmp_path / "jvm-tmp-notapid").mkdir()  # not ours to judge
    (tmp_path / "blockmgr-1").mkdir()

    folder = jvm_temp_folder(tmp_path)

    assert folder == tmp_path / f"jvm-tmp-{os.getpid()}"
    assert folder.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["blockmgr-1", "jvm-tmp-notapid", f"jvm-tmp-{living}", folder.name]
    )
    assert jvm_temp_folder(tmp_path) == folder  # again: the same folder, kept
