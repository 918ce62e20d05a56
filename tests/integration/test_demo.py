"""`tributary demo` (what `make demo` runs) from an empty state folder: it starts its own stack
and the parts, runs the social network end to end and exits 0 with every check held."""

import shutil
import subprocess
import sys
from pathlib import Path

from infra.stack.isolated import free_port_block, isolated_settings, settings_env

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_runs_end_to_end_in_a_fresh_home() -> None:
    settings = isolated_settings("tributary-demo-", api_port=free_port_block(1))
    env = {**settings_env(settings), "TRIBUTARY_API_PORT": str(settings.api_port), "COLUMNS": "160"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "infra.cli", "demo"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-6000:] + _part_logs(settings.home / "logs")
        assert "summary" in output and "FAILED" not in output
        assert "restart #" not in output, output[-6000:]  # every part started the first time
        for check in (
            "search index",
            "profile cache",
            "home timeline",
            "rename reaches search",
            "delete leaves every timeline",
            "replay equals the live view",
        ):
            assert check in output
    finally:
        subprocess.run(
            [sys.executable, "-m", "infra.cli", "down", "--purge"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            timeout=300,
        )
        shutil.rmtree(settings.home.parent, ignore_errors=True)


def _part_logs(folder: Path) -> str:
    """The end of each supervised part's log, to tell why a failed demo failed."""
    if not folder.is_dir():
        return ""
    return "".join(
        f"\n--- {log.name} ---\n{log.read_text(errors='replace')[-2500:]}"
        for log in sorted(folder.glob("run-*.log"))
    )
