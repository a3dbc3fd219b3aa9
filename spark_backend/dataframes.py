"""DataFrames to Parquet in a Store, in the column types the readers turn into tensors.

Numeric and boolean columns stay scalars; ``pyspark.ml.linalg`` vectors
(dense or sparse) and arrays of numbers become lists of numbers. Anything
else is refused before a byte is written, with the column and its type
named. The data is written as ``num_files`` files, so every rank's shard
(a contiguous range of rows, see :mod:`hora.spark.shards`) touches few of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hora.spark.store import Store

__all__ = ["check_columns", "parquet_rows", "write_parquet"]

_NUMERIC = ("ByteType", "ShortType", "IntegerType", "LongType", "FloatType", "DoubleType", "BooleanType")


def _kind(data_type: Any) -> str | None:
    """ "scalar", "vector", "array", or None for a type the readers cannot turn into tensors."""
    name = type(data_type).__name__
    if name in _NUMERIC or name == "DecimalType":
        return "scalar"
    if name == "VectorUDT":
        return "vector"
    if name == "ArrayType" and type(data_type.elementType).__name__ in _NUMERIC:
        return "array"
    return None


def check_columns(df: Any, columns: Sequence[str], what: str = "column") -> dict[str, str]:
    """Checks that every column exists and holds numbers; returns each column's kind.

    Raises:
        ValueError: a column is missing (the message lists the DataFrame's
            columns) or is not numeric, a vector or an array of numbers.
    """
    fields = {f.name: f.dataType for f in df.schema.fields}
    kinds = {}
    for column in columns:
        if column not in fields:
            raise ValueError(f"The {what} {column!r} is not in the DataFrame; its columns are {sorted(fields)}.")
        kind = _kind(fields[column])
        if kind is None:
            raise ValueError(
                f"The {what} {column!r} has type {fields[column].simpleString()}; expected a number, a boolean, "
                "a pyspark.ml.linalg vector or an array of numbers. Encode it first (for example with "
                "StringIndexer or VectorAssembler)."
            )
        kinds[column] = kind
    return kinds


def write_parquet(
    df: Any, store: Store, path: str, columns: Sequence[str] | None = None, num_files: int = 8,
    vector_dtype: str = "float32",
) -> int:  # fmt: skip
    """Writes ``columns`` of ``df`` (default: all) as Parquet under ``path`` of ``store``; returns the row count.

    Vector columns become arrays of ``vector_dtype``; DECIMAL columns become doubles.
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F  # noqa: N812 - pyspark's own convention

    columns = list(columns) if columns is not None else list(df.columns)
    kinds = check_columns(df, columns)
    if num_files < 1:
        raise ValueError(f"num_files must be at least 1, got {num_files}.")
    selected = []
    for column in columns:
        if kinds[column] == "vector":
            selected.append(vector_to_array(F.col(column), vector_dtype).alias(column))
        elif type(df.schema[column].dataType).__name__ == "DecimalType":
            selected.append(F.col(column).cast("double").alias(column))
        else:
            selected.append(F.col(column))
    frame = df.select(*selected).repartition(num_files)
    frame.write.mode("overwrite").parquet(store.spark_path(path))
    return parquet_rows(store, path)


def parquet_rows(store: Store, path: str) -> int:
    """Rows of the Parquet dataset at ``path``, from its footers (no data read)."""
    import pyarrow.dataset as ds

    dataset = ds.dataset(store.arrow_path(path), format="parquet", filesystem=store.arrow_filesystem())
    return sum(fragment.metadata.num_rows for fragment in dataset.get_fragments())
