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

__all__ = ["Predictor", "predict_columns"]


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


def _output_sizes(predictor: Predictor, df: Any, inputs: list[Any], input_shapes: Any) -> list[int] | None:
    """Values per row of each output, from running the model on one row of ``df`` (None when it is empty)."""
    sample = df.select(*inputs).limit(1).toPandas()
    if sample.empty:
        return None
    outputs = predictor.load()(_inputs([sample[c] for c in sample], input_shapes, predictor.float_dtype))
    return [int(np.prod(out.shape[1:])) for out in outputs]


def predict_columns(model: Any, df: Any, predictor: Predictor) -> Any:
    """``df`` with ``model``'s output columns added, computed by ``predictor`` on the executors."""
    from hora.spark import check_columns
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F  # noqa: N812 - pyspark's own convention
    from pyspark.sql import types as T  # noqa: N812

    feature_cols, output_cols = model.getFeatureCols(), model.getOutputCols()
    input_shapes = model.getInputShapes()
    kinds = check_columns(df, feature_cols, "feature column")
    inputs = [vector_to_array(F.col(c), "float32") if kinds[c] == "vector" else F.col(c) for c in feature_cols]
    shapes = model.output_sizes or _output_sizes(predictor, df, inputs, input_shapes)
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
