"""A trained model's predictions as DataFrame columns, computed on the executors over Arrow batches.

A pandas UDF of the iterator kind receives each partition as Arrow-backed
batches (``spark.sql.execution.arrow.maxRecordsPerBatch`` rows), loads the
model once, and returns one column per model output: a double where the
output has one value per row, an array of doubles otherwise. Nothing is
collected to the driver but one row, used to learn the outputs' shapes, so
DataFrames larger than memory work.
"""

# No "from __future__ import annotations" here: pyspark reads the UDF's type hints at runtime.

from collections.abc import Iterator
from typing import Any

import cloudpickle
import numpy as np
import pandas as pd

__all__ = ["predict_columns"]


def _inputs(columns: list[Any], input_shapes: Any, dtype: Any) -> list[Any]:
    """Model inputs from the UDF's pandas columns (arrays of numbers become 2-D)."""
    import torch

    tensors = []
    for i, series in enumerate(columns):
        values = series.to_numpy()
        if values.dtype == object:  # one array per row
            values = np.stack(values)
        tensor = torch.from_numpy(np.ascontiguousarray(values))
        tensor = tensor.to(dtype) if tensor.is_floating_point() or tensor.dtype == torch.bool else tensor
        if input_shapes is not None:
            tensor = tensor.reshape(input_shapes[i])
        elif tensor.dim() == 1:
            tensor = tensor.reshape(-1, 1)
        tensors.append(tensor)
    return tensors


def _outputs(result: Any) -> list[Any]:
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _output_sizes(net: Any, df: Any, inputs: list[Any], input_shapes: Any, dtype: Any) -> list[int] | None:
    """Values per row of each output, from running ``net`` on one row of ``df`` (None when it is empty)."""
    import torch

    sample = df.select(*inputs).limit(1).toPandas()
    if sample.empty:
        return None
    net.eval()
    with torch.no_grad():
        outputs = _outputs(net(*_inputs([sample[c] for c in sample], input_shapes, dtype)))
    return [out.shape[1:].numel() for out in outputs]


def predict_columns(model: Any, df: Any) -> Any:
    """``df`` with ``model``'s output columns added."""
    import torch
    from hora.spark import check_columns
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F  # noqa: N812 - pyspark's own convention
    from pyspark.sql import types as T  # noqa: N812

    feature_cols, output_cols = model.getFeatureCols(), model.getOutputCols()
    input_shapes = model.getInputShapes()
    kinds = check_columns(df, feature_cols, "feature column")
    inputs = [vector_to_array(F.col(c), "float32") if kinds[c] == "vector" else F.col(c) for c in feature_cols]
    net = model.getModel()
    dtype = next((p.dtype for p in net.parameters() if p.is_floating_point()), torch.float32)
    shapes = model.output_sizes or _output_sizes(net, df, inputs, input_shapes, dtype)
    if shapes is None:  # an empty DataFrame, and a model that was never trained here
        return df.select("*", *[F.lit(None).cast("double").alias(c) for c in output_cols])
    if len(shapes) != len(output_cols):
        raise ValueError(f"The model returns {len(shapes)} outputs but there are {len(output_cols)} output columns.")
    fields = [
        T.StructField(c, T.DoubleType() if n == 1 else T.ArrayType(T.DoubleType()))
        for c, n in zip(output_cols, shapes, strict=True)
    ]
    blob = cloudpickle.dumps(net)

    def predict(batches: Iterator[tuple[pd.Series, ...]]) -> Iterator[pd.DataFrame]:
        local = cloudpickle.loads(blob)
        local.eval()
        torch.set_num_threads(1)
        for columns in batches:
            if isinstance(columns, pd.Series):  # one feature column comes alone, not in a tuple
                columns = (columns,)
            with torch.no_grad():
                outs = _outputs(local(*_inputs(list(columns), input_shapes, dtype)))
            frame = {}
            for name, out, size in zip(output_cols, outs, shapes, strict=True):
                values = out.detach().double().reshape(len(out), -1).numpy()
                frame[name] = values[:, 0] if size == 1 else list(values)
            yield pd.DataFrame(frame)

    udf = F.pandas_udf(predict, T.StructType(fields))
    struct = "__hora_predictions"
    result = df.withColumn(struct, udf(*inputs))
    return result.select("*", *[F.col(f"{struct}.{c}").alias(c) for c in output_cols]).drop(struct)
