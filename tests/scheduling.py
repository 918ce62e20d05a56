"""How `make test` spreads the suite over its pytest-xdist workers.

Every test that starts Spark (on the session's SparkSession or in a child process:
`tributary run views`, the demo, a driver of its own) runs in one worker, one after another;
so do the tests of a module that build on one another; every other test is its own unit and
goes to whichever worker is free. Two Spark drivers at once on two cores made Spark's Python
processes miss their hard-coded 10 s to connect back ("Python worker failed to connect
back"), and views stopped with it.

pytest-xdist's own ``--dist loadgroup`` cannot do it under pytest 9: it marks a group by
rewriting ``item._nodeid``, which pytest 9 no longer reads, so every ``xdist_group`` mark was
ignored. The scheduler below groups by path, on the controller.
"""

from typing import Any

SPARK_STARTING = (  # folders, files, or single tests (``file::test``)
    "tests/integration/analytics/test_analytics.py",
    "tests/integration/analytics/test_live_path.py::test_a_long_jvm_error_in_a_batch_stays_short",
    "tests/integration/operations/",
    "tests/integration/pipeline/",
    "tests/integration/social/",
    "tests/integration/spark_streaming/",
    "tests/integration/eventsourcing/test_bank_example.py",
    "tests/integration/test_demo.py",
    "tests/integration/test_run_supervisor.py",
)


#: Modules whose tests build on one another through a module-scoped fixture (the stack of
#: test_stack_lifecycle: up, up again, down): one unit, in file order, in one worker. Spread
#: over workers, `down` ran on a worker where no `up` had.
IN_ORDER = ("tests/integration/test_stack_lifecycle.py",)


def starts_spark(nodeid: str) -> bool:
    return nodeid.startswith(SPARK_STARTING)


def unit_of(nodeid: str) -> str:
    """The scheduling unit of a test: every Spark test is one; a module of :data:`IN_ORDER`
    is one; any other test is its own."""
    if starts_spark(nodeid):
        return "spark"
    if nodeid.startswith(IN_ORDER):
        return nodeid.split("::", 1)[0]
    return nodeid


class SparkApart:
    """A pytest plugin (registered only when pytest-xdist is): the scheduler above."""

    def pytest_xdist_make_scheduler(self, config: Any, log: Any) -> Any:
        from xdist.scheduler import LoadScopeScheduling

        class Scheduling(LoadScopeScheduling):  # type: ignore[misc]
            def _split_scope(self, nodeid: str) -> str:
                return unit_of(nodeid)

        return Scheduling(config, log)
