"""The Arrow schemas are built at first use (the view definitions import no Arrow); the text
and names kept beside them say the same as the schemas."""

import pytest

from projections import folding, mirror
from projections.view import PartitionFold, check_fold, per_partition
from tributary import view_model as model


def test_the_folded_ddl_is_the_folded_schema_as_spark_ddl() -> None:
    assert folding.spark_ddl(folding.FOLDED_SCHEMA) == folding.FOLDED_DDL
    assert folding.FOLDED_SCHEMA is folding.folded_schema()  # built once


def test_the_write_columns_are_the_write_schema_s_names() -> None:
    assert tuple(model.WRITE_SCHEMA.names) == model.WRITE_COLUMNS
    assert model.WRITE_SCHEMA is model.write_schema()
    assert folding.FOLDED_SCHEMA.names[: len(model.WRITE_COLUMNS)] == list(model.WRITE_COLUMNS)


def test_the_lazy_constants_are_module_attributes() -> None:
    assert mirror.ENVELOPE.names == ["op", "after", "source"]
    assert len(mirror.KEY) == 0
    with pytest.raises(AttributeError):
        _ = folding.NO_SUCH_CONSTANT


def test_a_fold_in_a_missing_module_fails_where_the_view_is_defined() -> None:
    with pytest.raises(ModuleNotFoundError):
        per_partition("projections.no_such_module:fold")


def test_a_missing_fold_function_fails_on_the_driver_before_a_query_runs_it() -> None:
    fold = per_partition("projections.mirror:no_such_fold")  # the module is not imported here
    with pytest.raises(AttributeError):
        check_fold(fold)
    check_fold(PartitionFold("projections.mirror:fold_changes"))
