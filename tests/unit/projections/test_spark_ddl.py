"""The Spark DDL of the folds' Arrow schemas is derived, not written twice."""

import pyarrow as pa

from projections.folding import FOLDED_DDL, spark_ddl


def test_the_folded_ddl_is_the_folded_schema_in_spark_types() -> None:
    assert FOLDED_DDL == (
        "collection string, key string, position long, deleted boolean, fields string,"
        " member string, changes array<long>, fresh boolean, topic string, partition int,"
        " offset long, error string, raw_key binary, raw_value binary"
    )
    schema = pa.schema([("tags", pa.list_(pa.string())), ("n", pa.int32())])
    assert spark_ddl(schema) == "tags array<string>, n int"
