"""Hora on Ray: ``RayExecutor`` (Hora workers as Ray actors), ``ElasticRayExecutor`` and Tune sweeps.

ray is imported only when an executor starts or a trainable is built.
"""

from hora.ray import tune
from hora.ray.elastic import ElasticRayExecutor, ElasticRaySettings
from hora.ray.executor import RayExecutor, RaySettings, WorkerState

__all__ = ["ElasticRayExecutor", "ElasticRaySettings", "RayExecutor", "RaySettings", "WorkerState", "tune"]
