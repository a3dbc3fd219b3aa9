"""Hora on Ray: ``RayExecutor`` (Hora workers as Ray actors) and Tune sweeps of distributed trials.

ray is imported only when an executor starts or a trainable is built.
"""

from hora.ray import tune
from hora.ray.executor import RayExecutor, WorkerState

__all__ = ["RayExecutor", "WorkerState", "tune"]
