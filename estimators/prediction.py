"""A trained model's predictions as DataFrame columns, computed on the executors over Arrow batches.

A pandas UDF of the iterator kind receives each partition as Arrow-backed
batches (``spark.sql.execution.arrow.maxRecordsPerBatch`` rows), loads the
model once through the framework's :class:`Predictor`, and returns one
column per model output: a double where the output has one value per row,
an array of doubles otherwise. Nothing is collected to the driver but one
row, used to learn the outputs' shapes when training did not record them,
so DataFrames larger than memory work.
"""

# No "from __future__ import annotations" here: pyspark reads the UDF's type hints at runtime.

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import cloudpickle
import numpy as np
import pandas as pd

__all__ = ["Predictor", "input_example", "predict_columns"]


class Predictor(Protocol):
    """A trained model as the executors see it: picklable, loaded once per partition."""

    float_dtype: np.dtype  # floating and boolean features are given to the model in this dtype

    def load(self) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        """The model as a function from a batch's inputs (one array per feature) to its outputs (one per label)."""
        ...


def _inputs(columns: list[Any], input_shapes: Any, float_dtype: np.dtype) -> list[np.ndarray]:
    """Model inputs from the UDF's pandas columns (arrays of numbers become 2-D)."""
    arrays = []
    for i, series in enumerate(columns):
        values = series.to_numpy()
        if values.dtype == object:  # one array per row
            values = np.stack(values)
        if values.dtype.kind in "fb":
            values = values.astype(float_dtype, copy=False)
        if input_shapes is not None:
            values = values.reshape(input_shapes[i])
        elif values.ndim == 1:
            values = values.reshape(-1, 1)
        arrays.append(np.ascontiguousarray(values))
    return arrays


def _feature_columns(df: Any, feature_cols: list[str]) -> list[Any]:
    """The feature columns as the model reads them (vectors become arrays of float)."""
    from hora.spark import check_columns
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F  # noqa: N812 - pyspark's own convention

    kinds = check_columns(df, feature_cols, "feature column")
    return [vector_to_array(F.col(c), "float32") if kinds[c] == "vector" else F.col(c) for c in feature_cols]


def input_example(model: Any, df: Any, float_dtype: np.dtype) -> list[np.ndarray] | None:
    """The model's inputs for the first row of ``df`` (None when it is empty)."""
    sample = df.select(*_feature_columns(df, model.getFeatureCols())).limit(1).toPandas()
    if sample.empty:
        return None
    return _inputs([sample[c] for c in sample], model.getInputShapes(), float_dtype)


def _output_sizes(predictor: Predictor, model: Any, df: Any) -> list[int] | None:
    """Values per row of each output, from running the model on one row of ``df`` (None when it is empty)."""
    example = input_example(model, df, predictor.float_dtype)
    if example is None:
        return None
    return [int(np.prod(out.shape[1:])) for out in predictor.load()(example)]


def predict_columns(model: Any, df: Any, predictor: Predictor) -> Any:
    """``df`` with ``model``'s output columns added, computed by ``predictor`` on the executors."""
    from pyspark.sql import functions as F  # noqa: N812 - pyspark's own convention
    from pyspark.sql import types as T  # noqa: N812

    output_cols, input_shapes = model.getOutputCols(), model.getInputShapes()
    inputs = _feature_columns(df, model.getFeatureCols())
    shapes = model.output_sizes or _output_sizes(predictor, model, df)
    if shapes is None:  # an empty DataFrame, and a model that was never trained here
        return df.select("*", *[F.lit(None).cast("double").alias(c) for c in output_cols])
    if len(shapes) != len(output_cols):
        raise ValueError(f"The model returns {len(shapes)} outputs but there are {len(output_cols)} output columns.")
    fields = [
        T.StructField(c, T.DoubleType() if n == 1 else T.ArrayType(T.DoubleType()))
        for c, n in zip(output_cols, shapes, strict=True)
    ]
    blob = cloudpickle.dumps(predictor)

    def predict(batches: Iterator[tuple[pd.Series, ...]]) -> Iterator[pd.DataFrame]:
        local = cloudpickle.loads(blob)
        run = local.load()
        for columns in batches:
            if isinstance(columns, pd.Series):  # one feature column comes alone, not in a tuple
                columns = (columns,)
            outs = run(_inputs(list(columns), input_shapes, local.float_dtype))
            frame = {}
            for name, out, size in zip(output_cols, outs, shapes, strict=True):
                values = np.asarray(out, dtype=np.float64).reshape(len(out), -1)
                frame[name] = values[:, 0] if size == 1 else list(values)
            yield pd.DataFrame(frame)

    udf = F.pandas_udf(predict, T.StructType(fields))
    struct = "__hora_predictions"
    result = df.withColumn(struct, udf(*inputs))
    return result.select("*", *[F.col(f"{struct}.{c}").alias(c) for c in output_cols]).drop(struct)
