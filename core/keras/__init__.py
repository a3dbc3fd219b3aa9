"""Hora for Keras 3: Horovod's Keras API, so ``import hora.keras as hvd`` (or ``hora.tensorflow.keras``) is the change.

::

    import keras
    import hora.keras as hvd

    hvd.init()
    model = keras.Sequential([keras.layers.Dense(10, input_shape=(784,))])
    opt = keras.optimizers.Adam(learning_rate=0.001 * hvd.size())
    opt = hvd.DistributedOptimizer(opt)
    model.compile(optimizer=opt, loss="mse", metrics=["accuracy"])
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
    model.fit(x, y, epochs=10, batch_size=32, callbacks=callbacks)

Works on each Keras backend: TensorFlow (``model.fit`` compiles the step
into a ``tf.function``; the gradients cross to the engine once per step
through ``hora.tensorflow``), JAX (inside ``jit``, through ``hora.jax``'s
ordered host callback) and torch (eagerly, through ``hora.torch``). On
TensorFlow, a step compiled with XLA cannot call the engine:
``model.compile(jit_compile=True)`` fails at trace time with
:class:`hora.tensorflow.XlaUnsupportedError`, and Keras's default
(``"auto"``) resolves to False with a warning. JAX keeps ``jit``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
from hora import (
    Average,
    HoraError,
    HoraInternalError,
    Max,
    Min,
    ProcessSet,
    Product,
    ReduceOp,
    Sum,
    add_process_set,
    cross_rank,
    cross_size,
    global_process_set,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_enabled,
    mpi_threads_supported,
    rank,
    remove_process_set,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from hora.build_info import ccl_built, cuda_built, ddl_built, gloo_built, mpi_built, nccl_built, rocm_built
from hora.compression import Compression, Compressor
from hora.keras import callbacks, elastic
from hora.keras.functions import allgather, allreduce, broadcast, broadcast_global_variables, broadcast_variables
from hora.keras.optimizer import DistributedOptimizer
from hora.keras.sync_batch_norm import SyncBatchNormalization
from hora.objects import allgather_object, broadcast_object

HorovodInternalError = HoraInternalError
"""Horovod's name for :class:`hora.HoraInternalError`."""

__all__ = [
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HoraError",
    "HoraInternalError",
    "HorovodInternalError",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "ReduceOp",
    "Sum",
    "SyncBatchNormalization",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_variables",
    "callbacks",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_homogeneous",
    "is_initialized",
    "load_model",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]


def load_model(
    filepath: Any,
    custom_optimizers: Sequence[type] | None = None,
    custom_objects: dict[str, Any] | None = None,
    compression: Compressor = Compression.none,
) -> keras.Model:
    """Loads a model saved with ``model.save`` whose optimizer comes back as a ``DistributedOptimizer``.

    The optimizer's state (iterations, moments) is restored as Keras
    restores it. A model saved with a ``LossScaleOptimizer`` (mixed
    precision) is not supported: load it with Keras and wrap a new optimizer.

    Args:
        filepath: the ``.keras`` file.
        custom_optimizers: optimizer classes of your own to wrap as well.
        custom_objects: passed to ``keras.models.load_model``.
        compression: the restored optimizer's gradient compression.
    """
    classes = [getattr(keras.optimizers, n) for n in dir(keras.optimizers)]
    classes = [c for c in classes if isinstance(c, type) and issubclass(c, keras.optimizers.Optimizer)]
    excluded = (keras.optimizers.Optimizer, keras.optimizers.LossScaleOptimizer)
    classes = [c for c in classes if c not in excluded] + list(custom_optimizers or [])
    restorers = {
        c.__name__: type(c.__name__, (_Restorer,), {"optimizer_class": c, "compression": compression}) for c in classes
    }
    return keras.models.load_model(filepath, custom_objects={**restorers, **(custom_objects or {})})


class _Restorer:
    """What ``load_model`` gives Keras for an optimizer class: its ``from_config`` makes it distributed."""

    optimizer_class: type
    compression: Compressor

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> keras.optimizers.Optimizer:
        return DistributedOptimizer(cls.optimizer_class.from_config(config), compression=cls.compression)
