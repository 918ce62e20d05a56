"""How `make test` splits the suite into units for its workers (tests/scheduling.py)."""

from tests.scheduling import unit_of


def test_spark_tests_share_one_unit_and_others_are_their_own() -> None:
    assert unit_of("tests/integration/social/test_takeover.py::test_a") == "spark"
    assert unit_of("tests/integration/test_demo.py::test_the_demo") == "spark"
    assert unit_of("tests/integration/cdc/test_capture.py::test_a") == (
        "tests/integration/cdc/test_capture.py::test_a"
    )


def test_the_tests_of_a_module_that_build_on_one_another_share_their_modules_unit() -> None:
    up = unit_of("tests/integration/test_stack_lifecycle.py::test_up_from_empty_folder")
    down = unit_of("tests/integration/test_stack_lifecycle.py::test_down_leaves_no_process")
    assert up == down == "tests/integration/test_stack_lifecycle.py"
