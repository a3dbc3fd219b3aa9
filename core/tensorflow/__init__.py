"""Hora for TensorFlow 2: Horovod's TensorFlow API, so ``import hora.tensorflow as hvd`` is the only change.

::

    import tensorflow as tf
    import hora.tensorflow as hvd

    hvd.init()
    model = tf.keras.Sequential([...])
    optimizer = tf.keras.optimizers.SGD(0.01 * hvd.size())

    @tf.function
    def step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    hvd.broadcast_variables(model.variables, root_rank=0)

Hora builds nothing against TensorFlow (no custom op, no headers): the
collectives run eagerly as direct calls, and inside ``tf.function`` or a
``tf.compat.v1`` graph as one ``tf.numpy_function`` per group of tensors
(see :mod:`hora.tensorflow.crossing`). A function compiled with XLA
(``jit_compile=True``) cannot call the host: tracing a collective there
raises :class:`hora.HoraError`. Importing this module imports TensorFlow;
``import hora`` does not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
from hora import objects as _objects
from hora.build_info import ccl_built, cuda_built, ddl_built, gloo_built, mpi_built, nccl_built, rocm_built
from hora.compression import Compression
from hora.keras.sync_batch_norm import SyncBatchNormalization
from hora.tensorflow import elastic
from hora.tensorflow.collectives import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from hora.tensorflow.control import (
    barrier,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)
from hora.tensorflow.crossing import XlaUnsupportedError
from hora.tensorflow.gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from hora.tensorflow.optimizer import DistributedOptimizer
from hora.tensorflow.variables import (
    BroadcastGlobalVariablesHook,
    broadcast_,
    broadcast_global_variables,
    broadcast_variables,
)

HorovodInternalError = HoraInternalError
"""Horovod's name for :class:`hora.HoraInternalError`, so ``except hvd.HorovodInternalError`` keeps working."""


def broadcast_object(
    obj: Any, root_rank: int = 0, session: Any = None, name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:  # fmt: skip
    """Returns ``root_rank``'s ``obj`` on every rank (see :func:`hora.broadcast_object`).

    ``session`` is accepted for Horovod compatibility: the bytes travel on
    the host, eagerly and in ``tf.compat.v1`` graphs alike.
    """
    return _objects.broadcast_object(obj, root_rank, name, process_set)


def broadcast_object_fn(
    root_rank: int = 0, session: Any = None, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Callable[[Any], Any]:
    """Returns a function that broadcasts its argument from ``root_rank`` (Horovod's ``tf.compat.v1`` helper)."""
    return lambda obj: _objects.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(
    obj: Any, session: Any = None, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """Returns the list of every member's ``obj``, in rank order (see :func:`hora.allgather_object`)."""
    return _objects.allgather_object(obj, name, process_set)


__all__ = [
    "Average",
    "BroadcastGlobalVariablesHook",
    "Compression",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "HoraError",
    "HoraInternalError",
    "HorovodInternalError",
    "Max",
    "Min",
    "PartialDistributedGradientTape",
    "ProcessSet",
    "Product",
    "ReduceOp",
    "Sum",
    "SyncBatchNormalization",
    "XlaUnsupportedError",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "broadcast_variables",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_rank_op",
    "local_size",
    "local_size_op",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "process_set_included_op",
    "rank",
    "rank_op",
    "reducescatter",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "size_op",
    "start_timeline",
    "stop_timeline",
]
