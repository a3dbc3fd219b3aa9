"""Hora for JAX: collectives on ``jax.Array`` inside and outside ``jit``, and gradient averaging for optax loops.

::

    import jax, optax
    import hora.jax as hvd

    hvd.init()
    params = hvd.broadcast_variables(init_params(jax.random.key(0)), root_rank=0)
    optimizer = optax.chain(hvd.allreduce_gradients(), optax.adam(1e-3 * hvd.size()))

    @jax.jit
    def step(params, state, batch):
        grads = jax.grad(loss)(params, batch)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state

Hora builds nothing against JAX: a collective is one host callback per
group of arrays (``jax.experimental.buffer_callback``, on XLA's buffers
without a copy, an allreduce in place, kept in program order; never ``pure_callback``, which JAX
may drop or reorder), see :mod:`hora.jax.crossing`. Importing this module imports JAX; ``import hora``
does not. Keras on the JAX backend uses it through ``hora.keras``.
"""

from __future__ import annotations

from typing import Any

import jax
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
)
from hora.compression import Compression
from hora.jax.collectives import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    broadcast_group,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from hora.jax.crossing import check_arrays
from hora.jax.gradients import GradientTransformation, allreduce_gradients
from hora.objects import allgather_object, broadcast_object

__all__ = [
    "Average",
    "Compression",
    "GradientTransformation",
    "HoraError",
    "HoraInternalError",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "ReduceOp",
    "Sum",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "allreduce_gradients",
    "alltoall",
    "broadcast",
    "broadcast_object",
    "broadcast_variables",
    "cross_rank",
    "cross_size",
    "global_process_set",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allreduce",
    "grouped_reducescatter",
    "init",
    "is_homogeneous",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_enabled",
    "mpi_threads_supported",
    "rank",
    "reducescatter",
    "remove_process_set",
    "shutdown",
    "size",
]


def broadcast_variables(tree: Any, root_rank: int = 0, process_set: ProcessSet = global_process_set) -> Any:
    """Returns ``tree`` (a pytree of arrays: parameters, optimizer state) with ``root_rank``'s values.

    All leaves cross to the engine at once. JAX arrays are immutable, so
    use the returned tree: ``params = hvd.broadcast_variables(params, 0)``.
    """
    from hora._arrays import check_root
    from hora.basics import current_job
    from hora.process_sets import set_id

    set_id(process_set, "jax.broadcast_variables")
    root = check_root(root_rank, current_job().size, "jax.broadcast_variables")
    leaves, structure = jax.tree_util.tree_flatten(tree)
    arrays = [jax.numpy.asarray(leaf) for leaf in leaves]
    # A broadcast only moves bytes: unsigned types the engine does not reduce travel as the signed type of
    # their width (bit for bit), and come back as they were.
    moved = [jax.lax.bitcast_convert_type(a, _SIGNED_OF[a.dtype]) if a.dtype in _SIGNED_OF else a for a in arrays]
    moved = check_arrays(moved, "broadcast_variables")
    received = broadcast_group(moved, root, None, process_set, "broadcast_variables") if moved else []
    restored = [
        jax.lax.bitcast_convert_type(r, a.dtype) if a.dtype in _SIGNED_OF else r
        for r, a in zip(received, arrays, strict=True)
    ]
    return jax.tree_util.tree_unflatten(structure, restored)


_SIGNED_OF = {
    jax.numpy.dtype("uint16"): jax.numpy.int16,
    jax.numpy.dtype("uint32"): jax.numpy.int32,
    jax.numpy.dtype("uint64"): jax.numpy.int64,
}
