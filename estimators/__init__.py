"""Spark ML Estimators that train with Hora: ``TorchEstimator(...).fit(df)`` returns a ``TorchModel``.

They are ``pyspark.ml`` Estimators and Models: Params, ``fit``/``transform``,
``save``/``load``, Pipelines and ``CrossValidator`` work as for any other.
"""

from hora.estimators.torch_estimator import TorchEstimator, TorchModel

__all__ = ["TorchEstimator", "TorchModel"]
