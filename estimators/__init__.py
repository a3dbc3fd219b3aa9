"""Spark ML Estimators that train with Hora: ``TorchEstimator(...).fit(df)`` returns a ``TorchModel``,
``KerasEstimator(...).fit(df)`` a ``KerasModel``.

They are ``pyspark.ml`` Estimators and Models: Params, ``fit``/``transform``,
``save``/``load``, Pipelines and ``CrossValidator`` work as for any other.
"""

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("hora.estimators needs pyspark: pip install 'hora[spark]'.") from exc

from hora.estimators.keras_estimator import KerasEstimator, KerasModel
from hora.estimators.torch_estimator import TorchEstimator, TorchModel

__all__ = ["KerasEstimator", "KerasModel", "TorchEstimator", "TorchModel"]
