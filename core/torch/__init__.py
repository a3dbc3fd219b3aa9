"""Hora for PyTorch: Horovod's torch API, so ``import hora.torch as hvd`` is the only change.

    import torch
    import hora.torch as hvd

    hvd.init()
    model = ...
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

Hora compiles against no torch headers: any torch release with the Python API
of 2.x works. CPU tensors are exchanged in place; CUDA tensors through pinned
host memory.
"""

from __future__ import annotations

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
    barrier,
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
    poll,
    rank,
    remove_process_set,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
    synchronize,
)
from hora import join as _join
from hora.build_info import ccl_built, cuda_built, ddl_built, gloo_built, mpi_built, nccl_built, rocm_built
from hora.compression import Compression
from hora.objects import allgather_object, broadcast_object
from hora.torch import elastic
from hora.torch.collectives import (
    allgather_async,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    reducescatter_async,
)
from hora.torch.differentiable import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from hora.torch.optimizer import DistributedOptimizer
from hora.torch.sparse import sparse_allreduce_async
from hora.torch.state import broadcast_optimizer_state, broadcast_parameters
from hora.torch.sync_batch_norm import SyncBatchNorm

HorovodInternalError = HoraInternalError
"""Horovod's name for :class:`hora.HoraInternalError`, so ``except hvd.HorovodInternalError`` keeps working."""


def join(device: int = -1) -> int:
    """Declares that this rank has no more batches and serves the others' collectives until all have joined.

    Returns the rank that joined last. ``device`` is accepted for Horovod
    compatibility; Hora needs no device for it.
    """
    return _join()


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
    "SyncBatchNorm",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
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
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]
