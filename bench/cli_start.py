"""Benchmark: how long the ``tributary`` CLI takes as a whole process (not a test).

    .venv/bin/python bench/cli_start.py [--runs 10] [--no-stack]

Starts a local stack of its own (a fresh state folder on free ports; ``--no-stack``: none, so
``status`` reports every service down), then times, as whole processes and interleaved round by
round (a burst of load on the machine hits every command alike):

- ``python -c pass``: the interpreter's own start, the baseline;
- ``tributary --help``;
- ``tributary status`` and ``tributary status --json`` against that stack (no parts running:
  the connector not started, the views never run);
- with the stack only (without one they wait for the broker's timeouts): ``tributary views``
  and ``views --json`` (each configured view's store and topics, all empty),
  ``tributary command CreatePost --data ...`` as a user sends one: without ``--wait``, so it
  returns once the broker has the command (no processor runs; ``--wait`` would time the
  processor), and ``tributary query timeline 42`` (a declared query against the empty view:
  ``[]``).

Prints min and median of each (after one warm-up run of each, which fills the bytecode caches)
and each as a ratio to the baseline's. The aim of issue 24: ``status`` under 0.3 s.

The processes run as a user's do, with bytecode caches (written to a folder of the bench's own,
``PYTHONPYCACHEPREFIX``): with ``PYTHONDONTWRITEBYTECODE=1`` in the environment every module
of the project is compiled again at each start (≈0.15 s of ``status``); ``--no-bytecode-cache``
measures that way.
"""

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stopping import stop_cleanly_on_sigterm
from infra.stack import LocalStack
from infra.stack.isolated import isolated_settings, settings_env

EXTERNAL = (
    "TRIBUTARY_KAFKA_BOOTSTRAP_SERVERS",
    "TRIBUTARY_POSTGRES_URL",
    "TRIBUTARY_REDIS_URL",
    "TRIBUTARY_SCHEMA_REGISTRY_URL",
)
TRIBUTARY = str(Path(sys.executable).with_name("tributary"))


POST = '{"post_id": 1, "author_id": 1, "text": "hi"}'


def commands(stack: bool) -> dict[str, list[str]]:
    cmds = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "tributary --help": [TRIBUTARY, "--help"],
        "tributary status": [TRIBUTARY, "status"],
        "tributary status --json": [TRIBUTARY, "status", "--json"],
    }
    if stack:
        cmds |= {
            "tributary views": [TRIBUTARY, "views"],
            "tributary views --json": [TRIBUTARY, "views", "--json"],
            "tributary command": [TRIBUTARY, "command", "CreatePost", "--data", POST],
            "tributary query": [TRIBUTARY, "query", "timeline", "42"],
        }
    return cmds


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr.decode()}")
    return elapsed


def measure(env: dict[str, str], runs: int, stack: bool) -> dict[str, list[float]]:
    cmds = commands(stack)
    for argv in cmds.values():  # warm-up: bytecode caches, the page cache
        timed(argv, env)
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(runs):
        for name, argv in cmds.items():
            times[name].append(timed(argv, env))
    return times


def report(times: dict[str, list[float]]) -> None:
    base = times["python -c pass"]
    base_min, base_median = min(base), statistics.median(base)
    print(f"{'command':<26}{'min s':>8}{'median s':>10}{'min x':>8}{'median x':>10}")
    for name, values in times.items():
        low, mid = min(values), statistics.median(values)
        print(f"{name:<26}{low:>8.3f}{mid:>10.3f}{low / base_min:>8.1f}{mid / base_median:>10.1f}")
    slow = [n for n in times if n != "python -c pass" and statistics.median(times[n]) >= 0.3]
    print(f"aim (issue 24): each median under 0.3 s; not yet: {', '.join(slow) or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--no-stack", action="store_true", help="time against no stack at all")
    parser.add_argument(
        "--no-bytecode-cache",
        action="store_true",
        help="compile every module at each start (PYTHONDONTWRITEBYTECODE=1)",
    )
    args = parser.parse_args()
    settings = isolated_settings(prefix="tributary-bench-cli-")
    env = settings_env(settings)
    for external in EXTERNAL:  # this stack, not one the environment names
        env.pop(external, None)
    if args.no_bytecode_cache:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(settings.home.parent / "pycache")
    stack = LocalStack(settings)
    try:
        if not args.no_stack:
            stack.up()
        cache = "none" if args.no_bytecode_cache else env["PYTHONPYCACHEPREFIX"]
        print(f"stack: {'none' if args.no_stack else stack.home}; bytecode cache: {cache};")
        print(f"{args.runs} runs each")
        report(measure(env, args.runs, not args.no_stack))
    finally:
        stack.down(purge=True)
        shutil.rmtree(settings.home.parent, ignore_errors=True)


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
