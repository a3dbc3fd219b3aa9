"""Fixtures the estimator tests share."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="session")
def linear(spark):
    """y = 1.5 a - 2 b + 0.5 c + 0.25 exactly, with a vector feature column and a validation flag (every 6th row)."""
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1200, 3))
    y = x @ np.array([1.5, -2.0, 0.5]) + 0.25
    rows = [(Vectors.dense(f), float(t), float(f[0]), i % 6 == 0) for i, (f, t) in enumerate(zip(x, y, strict=True))]
    return spark.createDataFrame(rows, ["features", "y", "a", "is_val"])
